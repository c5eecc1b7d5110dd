"""A Pulumi YAML program of the elastic-ctr package (``examples/yaml/Pulumi.yaml``) run in
this process under Pulumi's mocks, through the package's provider: each
``elastic-ctr:index:<Name>`` resource is built by ``ElasticCtrProvider.construct`` from its
properties as a program in another language sends them (schema names, numbers as doubles,
other resources' outputs as Outputs), each ``kubernetes:`` resource by pulumi-kubernetes.

The YAML handled is the subset the example uses, and anything else is refused
(``UnsupportedYaml``): ``config`` (values given by the caller; ``secret: true`` ones become
secret Outputs), ``variables``, ``resources`` (``type``, ``name``, ``properties``,
``options.dependsOn``: checked to name resources, not applied: a dependency declares
nothing), ``outputs``, and expressions ``${name}``, ``${name.property}``,
``${name.property[0].key}`` and ``${pulumi.stack}``, whole or inside a string.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Mapping

import pulumi

from provider.host import ElasticCtrProvider

EXPR = re.compile(r"\$\{([^}]*)\}")
_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]")


class UnsupportedYaml(ValueError):
    """The program uses Pulumi YAML this runner does not handle (named in the message)."""


class YamlProgram:
    """Runs the Pulumi YAML document ``doc`` (a parsed ``Pulumi.yaml``) with ``config`` (key ->
    value; required for every declared key) on stack ``stack``. Call ``run()`` inside a
    Pulumi program (``infra.render.run_program``): it declares every resource and returns the
    outputs (a dict of Inputs). ``constructed`` records ``(type, name, inputs)`` of every
    package component, the inputs as the provider received them."""

    def __init__(self, doc: Mapping[str, Any], config: Mapping[str, str], stack: str) -> None:
        unknown = set(doc) - {"name", "description", "runtime", "packages", "config", "variables", "resources",
                              "outputs"}
        if unknown:
            raise UnsupportedYaml(f"top-level keys {sorted(unknown)}")
        self.doc, self.stack = doc, stack
        self.config: dict[str, Any] = {}
        for key, decl in (doc.get("config") or {}).items():
            if key not in config:
                raise KeyError(f"config {key!r} is declared but not given")
            self.config[key] = pulumi.Output.secret(config[key]) if (decl or {}).get("secret") else config[key]
        self.provider = ElasticCtrProvider()
        self.resources: dict[str, dict[str, Any]] = {}
        self.variables: dict[str, Any] = {}
        self.constructed: list[tuple[str, str, dict]] = []
        self._busy: set[str] = set()

    def run(self) -> dict[str, Any]:
        """Declares every resource (in reference order) and returns the evaluated outputs."""
        for name in self.doc.get("resources") or {}:
            self.resource(name)
        return {k: self.value(v) for k, v in (self.doc.get("outputs") or {}).items()}

    # ------------------------------------------------------------------ values
    def value(self, node: Any) -> Any:
        """A property's value: expressions resolved, containers walked."""
        if isinstance(node, str):
            whole = EXPR.fullmatch(node)
            if whole:
                return self.resolve(whole.group(1))
            if EXPR.search(node):
                parts = [self.resolve(p) if i % 2 else p for i, p in enumerate(EXPR.split(node)) if p or i % 2]
                if any(isinstance(p, pulumi.Output) for p in parts):
                    return pulumi.Output.concat(*parts)
                return "".join(str(p) for p in parts)  # known now: a plain string, as Pulumi YAML gives it
            return node
        if isinstance(node, dict):
            fns = [k for k in node if str(k).startswith("fn::")]
            if fns:
                raise UnsupportedYaml(f"functions {fns}")
            return {k: self.value(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self.value(v) for v in node]
        return node

    def resolve(self, expr: str) -> Any:
        """The value of ``${expr}``."""
        m = re.fullmatch(r"([A-Za-z_][\w-]*)((?:\.[A-Za-z_][\w-]*|\[\d+\])*)", expr.strip())
        if not m:
            raise UnsupportedYaml(f"expression ${{{expr}}}")
        root, rest = m.group(1), m.group(2)
        steps = [(a or int(b)) for a, b in _STEP.findall(rest)]
        if root == "pulumi":
            if steps != ["stack"]:
                raise UnsupportedYaml(f"${{{expr}}}")
            return self.stack
        if root in self.config:
            base = self.config[root]
        elif root in (self.doc.get("variables") or {}):
            base = self.variable(root)
        elif root in (self.doc.get("resources") or {}):
            base = self.resource(root)
        else:
            raise KeyError(f"${{{expr}}}: {root!r} is no config key, variable or resource")
        return _walk(base, steps, expr)

    def variable(self, name: str) -> Any:
        if name not in self.variables:
            self.variables[name] = self.value(self.doc["variables"][name])
        return self.variables[name]

    # ------------------------------------------------------------------ resources
    def resource(self, key: str) -> dict[str, Any]:
        """The outputs of resource ``key`` (declared on first use)."""
        if key in self.resources:
            return self.resources[key]
        if key in self._busy:
            raise ValueError(f"resource {key!r} refers to itself")
        self._busy.add(key)
        spec = self.doc["resources"][key]
        unknown = set(spec) - {"type", "name", "properties", "options"}
        if unknown or set(spec.get("options") or {}) - {"dependsOn"}:
            raise UnsupportedYaml(f"resource {key!r}: {sorted(unknown | set(spec.get('options') or {}))}")
        for dep in (spec.get("options") or {}).get("dependsOn") or []:
            m = EXPR.fullmatch(dep)
            if not m or m.group(1) not in self.doc["resources"]:
                raise ValueError(f"resource {key!r}: dependsOn {dep!r} names no resource")
            self.resource(m.group(1))
        name, typ = spec.get("name", key), spec["type"]
        props = self.value(spec.get("properties") or {})
        if typ.startswith("elastic-ctr:"):
            inputs = _wire(props)
            self.constructed.append((typ, name, inputs))
            result = self.provider.construct(name, typ, inputs, pulumi.ResourceOptions())
            # the program gets each output property as one Output (a map of Secret names too)
            outputs = {k: pulumi.Output.from_input(v) for k, v in result.state.items()}
        elif typ.startswith("kubernetes:"):
            outputs = {"resource": _kubernetes(typ, name, props)}
        else:
            raise UnsupportedYaml(f"resource type {typ}")
        self.resources[key] = outputs
        self._busy.discard(key)
        return outputs


def _walk(base: Any, steps: list, expr: str) -> Any:
    """``base`` followed along ``steps`` (property names, list indexes), through Outputs."""
    if isinstance(base, dict) and "resource" in base and len(base) == 1:  # a kubernetes resource
        res = base["resource"]
        if not steps:
            return res
        base, steps = getattr(res, _snake(steps[0])), steps[1:]
    elif isinstance(base, dict) and steps and isinstance(steps[0], str):  # a component's outputs
        if steps[0] not in base:
            raise KeyError(f"${{{expr}}}: no output {steps[0]!r} (has {sorted(base)})")
        base, steps = base[steps[0]], steps[1:]
    for step in steps:
        base = pulumi.Output.from_input(base).apply(lambda v, s=step: _get(v, s))
    return base


def _get(value: Any, step) -> Any:
    if isinstance(step, int):
        return value[step]
    if isinstance(value, dict):
        return value[step]
    return getattr(value, _snake(step))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _wire(value: Any) -> Any:
    """``value`` as the engine hands it to a provider: every number a double."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def _kubernetes(typ: str, name: str, props: dict) -> pulumi.CustomResource:
    """A ``kubernetes:<group>/<version>:<Kind>`` resource of pulumi-kubernetes."""
    m = re.fullmatch(r"kubernetes:([\w.]+)/(\w+):(\w+)", typ)
    if not m:
        raise UnsupportedYaml(f"resource type {typ}")
    group, version, kind = m.groups()
    module = importlib.import_module(f"pulumi_kubernetes.{group.split('.')[0]}.{version}")
    return getattr(module, kind)(name, **{_snake(k): v for k, v in props.items()})
