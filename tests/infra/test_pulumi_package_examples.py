"""The example programs of the component package (examples/) checked against its schema
(provider/schema.json), as far as this machine can without the Pulumi CLI, Node.js's
TypeScript compiler or Go and without the SDKs ``pulumi package add`` generates:

* ``examples/yaml/Pulumi.yaml``: every property of every package resource is an input of
  its type with a value of that input's type (a literal, or an expression naming a config
  key, a variable or another resource's output of the same type), every required input is
  set (tests/infra/test_construct.py also runs it against the Python program);
* ``examples/typescript/index.ts`` and ``examples/go/main.go``: they construct only
  components of the package, set only their inputs (and of the input types only their
  properties), set every required one, and read only their outputs."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from provider.schema import SCHEMA_FILE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXPR = re.compile(r"\$\{([^}]*)\}")


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def component(schema: dict, name: str) -> dict:
    return schema["resources"][f"elastic-ctr:index:{name}"]


# ---------------------------------------------------------------------------------------- YAML
class YamlTypes:
    """Checks a Pulumi YAML program's package resources against the schema."""

    def __init__(self, schema: dict, doc: dict) -> None:
        self.schema, self.doc, self.errors = schema, doc, []

    def check(self) -> list[str]:
        for key, res in (self.doc.get("resources") or {}).items():
            typ = res.get("type", "")
            if not typ.startswith("elastic-ctr:"):
                continue
            if typ not in self.schema["resources"]:
                self.errors.append(f"{key}: no resource {typ} in the package")
                continue
            spec = self.schema["resources"][typ]
            self.object(res.get("properties") or {}, spec["inputProperties"], spec.get("requiredInputs", []), key)
        return self.errors

    def object(self, value, props: dict, required: list, path: str) -> None:
        for name in required:
            if name not in value:
                self.errors.append(f"{path}: required input {name} not set")
        for name, v in value.items():
            if name not in props:
                self.errors.append(f"{path}.{name}: no such input")
            else:
                self.value(v, props[name], f"{path}.{name}")

    def value(self, v, prop: dict, path: str) -> None:
        if isinstance(v, str) and EXPR.fullmatch(v):
            self.expression(EXPR.fullmatch(v).group(1), prop, path)
            return
        if "$ref" in prop:
            typ = self.schema["types"][prop["$ref"].split("/", 2)[2]]
            if not isinstance(v, dict):
                self.errors.append(f"{path}: {v!r} is not an object ({prop['$ref']})")
                return
            self.object(v, typ.get("properties", {}), typ.get("required", []), path)
            return
        kind = prop.get("type")
        ok = {"string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
              "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
              "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
              "array": lambda x: isinstance(x, list), "object": lambda x: isinstance(x, dict)}[kind]
        if not ok(v):
            self.errors.append(f"{path}: {v!r} is not of type {kind}")
        elif kind == "array":
            for i, item in enumerate(v):
                self.value(item, prop["items"], f"{path}[{i}]")
        elif kind == "object" and "additionalProperties" in prop:
            for k, item in v.items():
                self.value(item, prop["additionalProperties"], f"{path}.{k}")

    def expression(self, expr: str, prop: dict, path: str) -> None:
        """``${expr}`` as the value of ``prop``: a variable is checked as if written there;
        a config key must be a string (a secret one only for a secret input); another
        package resource's output must have the input's type."""
        root, *steps = expr.split(".")
        if root in (self.doc.get("variables") or {}) and not steps:
            self.value(self.doc["variables"][root], prop, f"{path}(${{{root}}})")
        elif root in (self.doc.get("config") or {}) and not steps:
            decl = self.doc["config"][root]
            if decl.get("type") != "string" or prop.get("type") != "string":
                self.errors.append(f"{path}: config {root} ({decl.get('type')}) for a {prop.get('type')} input")
            if decl.get("secret") and not prop.get("secret"):
                self.errors.append(f"{path}: the secret config {root} goes to an input not marked secret")
        elif root in (self.doc.get("resources") or {}):
            typ = self.doc["resources"][root]["type"]
            if not typ.startswith("elastic-ctr:"):  # another package's resource (the Namespace)
                return
            outputs = self.schema["resources"][typ]["properties"]
            if len(steps) != 1 or steps[0] not in outputs:
                self.errors.append(f"{path}: {typ} has no output {'.'.join(steps)}")
                return
            out = outputs[steps[0]]
            shape = ("type", "$ref", "items", "additionalProperties")
            if {k: out.get(k) for k in shape} != {k: _plain(prop.get(k)) for k in shape}:
                self.errors.append(f"{path}: output {root}.{steps[0]} {out} does not fit {prop}")
        else:
            self.errors.append(f"{path}: ${{{expr}}} names nothing the program declares")


def _plain(node):
    """A property's shape without its ``plain`` and ``description`` marks."""
    if not isinstance(node, dict):
        return node
    return {k: _plain(v) for k, v in node.items() if k not in ("plain", "description")}


def test_pulumi_package_yaml_example_validates_against_the_schema(schema):
    doc = yaml.safe_load((EXAMPLES / "yaml" / "Pulumi.yaml").read_text())
    assert doc["runtime"] == "yaml" and doc["packages"] == {"elastic-ctr": "../.."}
    assert YamlTypes(schema, doc).check() == []
    used = {r["type"] for r in doc["resources"].values()}
    assert {t for t in schema["resources"] if t != "elastic-ctr:index:ObjectStoreAccess"} <= used


@pytest.mark.parametrize("break_it,expected", [
    (lambda d: d["resources"]["serving"]["properties"].update(servingReplicas="two"), "is not of type integer"),
    (lambda d: d["resources"]["serving"]["properties"].update(replicas=2), "no such input"),
    (lambda d: d["resources"]["serving"]["properties"].pop("image"), "required input image"),
    (lambda d: d["variables"]["parts"].update(cube="cube"), "parts(${parts}).cube: no such input"),
    (lambda d: d["resources"]["serving"]["properties"].update(transferUrl="${cube.topology}"), "does not fit"),
    (lambda d: d["resources"]["fileserver"]["properties"].update(fileServerCpu="${uploadToken}"), "not marked secret"),
], ids=["type", "unknown", "required", "nested", "output-type", "secret"])
def test_pulumi_package_yaml_check_refuses_a_broken_example(schema, break_it, expected):
    doc = yaml.safe_load((EXAMPLES / "yaml" / "Pulumi.yaml").read_text())
    break_it(doc)
    errors = YamlTypes(schema, doc).check()
    assert any(expected in e for e in errors), errors


# ------------------------------------------------------------------------- TypeScript and Go
def block(text: str, start: int) -> str:
    """The text between the bracket at ``start`` and its match."""
    pairs, depth = {"{": "}", "(": ")", "[": "]"}, 0
    opener = text[start]
    for i in range(start, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == pairs[opener]:
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    raise ValueError(f"unbalanced {opener} at {start}")


def entries(body: str) -> list[tuple[str, str]]:
    """(key, value) of the top-level entries of an object literal's or a struct
    literal's body; a shorthand entry ``key`` has value ``key``."""
    out, depth, current, in_str = [], 0, "", None
    for ch in body:
        if in_str:
            in_str = None if ch == in_str else in_str
        elif ch in "\"'`":
            in_str = ch
        elif ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        if ch == "," and depth == 0 and not in_str:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    result = []
    for entry in (re.sub(r"//[^\n]*", "", e).strip() for e in out):
        if not entry:
            continue
        m = re.match(r'"?([\w./-]+)"?\s*:\s*(.*)', entry, re.DOTALL)
        result.append((m.group(1), m.group(2).strip()) if m else (entry, entry))
    return result


def check_program(schema: dict, text: str, new: re.Pattern, literal: str, field) -> list[str]:
    """Errors of a program whose package constructors match ``new`` (groups: variable or
    None, component, position of the args literal's ``{``) and whose input-type literals
    are ``literal % type``; ``field(name)`` is a schema name's spelling in the language."""
    errors, variables = [], {}
    for m in new.finditer(text):
        var, name, brace = m.group(1), m.group(2), m.end() - 1
        if f"elastic-ctr:index:{name}" not in schema["resources"]:
            errors.append(f"{name}: no such component")
            continue
        res = component(schema, name)
        if var:
            variables[var] = res
        inputs = {field(k): (k, v) for k, v in res["inputProperties"].items()}
        given = entries(block(text, brace))
        for key, value in given:
            if key not in inputs:
                errors.append(f"{name}.{key}: no such input")
            elif value.startswith("{") and "$ref" in inputs[key][1]:
                errors += check_type(schema, inputs[key][1]["$ref"], entries(block(value, 0)), field, f"{name}.{key}")
        for req in res.get("requiredInputs", []):
            if field(req) not in {k for k, _ in given}:
                errors.append(f"{name}: required input {req} not set")
    for token, typ in schema["types"].items():
        short = token.rsplit(":", 1)[1]
        for m in re.finditer(literal % short, text):
            errors += check_type(schema, f"#/types/{token}", entries(block(text, m.end() - 1)), field, short)
    for var, res in variables.items():
        outputs = {field(k) for k in res["properties"]}
        for m in re.finditer(rf"(?<![\w.]){var}\.(\w+)", text):
            if m.group(1) not in outputs:
                errors.append(f"{var}.{m.group(1)}: no such output")
    return errors


def check_type(schema, ref, given, field, path) -> list[str]:
    typ = schema["types"][ref.split("/", 2)[2]]
    props = {field(k) for k in typ.get("properties", {})}
    errors = [f"{path}.{k}: no such property of {ref}" for k, _ in given if k not in props]
    errors += [f"{path}: required {r} not set" for r in typ.get("required", []) if field(r) not in {k for k, _ in given}]
    return errors


TS_NEW = re.compile(r"(?:const (\w+) = )?new ectr\.(\w+)\(\s*\"[^\"]+\",\s*\{")
TS_TYPE = r"const \w+: ectr\.types\.input\.%sArgs = \{"
GO_NEW = re.compile(r"(?:(\w+), err :?= |_, err := |if _, err := )?elasticctr\.New(\w+)\(ctx, \"[^\"]+\", &elasticctr\.\w+Args\{")
GO_TYPE = r"elasticctr\.%sArgs\{"


def ts_objects(text: str) -> str:
    """The TypeScript program with its object consts that hold an input type spelled as
    such (``const deployment = {`` -> ``const deployment: ectr.types.input.DeploymentArgs``),
    by the inputs they are passed as (``deployment``, ``parts``)."""
    for name, typ in (("deployment", "Deployment"), ("parts", "Parts")):
        text = text.replace(f"const {name} = {{", f"const {name}: ectr.types.input.{typ}Args = {{")
    return text


def test_pulumi_package_typescript_example_names_only_what_the_schema_has(schema):
    text = ts_objects((EXAMPLES / "typescript" / "index.ts").read_text())
    assert 'import * as ectr from "@pulumi/elastic-ctr";' in text
    assert len(TS_NEW.findall(text)) == 10
    assert check_program(schema, text, TS_NEW, TS_TYPE, lambda k: k) == []
    broken = text.replace("servingReplicas: 2", "replicas: 2").replace("trackingServer: \"tracking\"", "tracker: 1")
    errors = check_program(schema, broken.replace("fileserver.tokenKey", "fileserver.key"), TS_NEW, TS_TYPE,
                           lambda k: k)
    assert {"Serving.replicas: no such input", "Parts.tracker: no such property of #/types/elastic-ctr:index:Parts",
            "fileserver.key: no such output"} <= set(errors), errors


def test_pulumi_package_go_example_names_only_what_the_schema_has(schema):
    text = (EXAMPLES / "go" / "main.go").read_text()
    assert '"example.com/pulumi-elastic-ctr/sdk/go/elasticctr"' in text
    assert len(GO_NEW.findall(text)) == 10

    def go(name: str) -> str:
        return name[0].upper() + name[1:]

    assert check_program(schema, text, GO_NEW, GO_TYPE, go) == []
    broken = text.replace("ServingReplicas:", "Replicas:").replace("transfer.StatusUrl", "transfer.Status")
    errors = check_program(schema, broken, GO_NEW, GO_TYPE, go)
    assert {"Serving.Replicas: no such input", "transfer.Status: no such output"} <= set(errors), errors
