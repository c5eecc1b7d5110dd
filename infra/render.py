"""Offline rendering: run the Pulumi program under mocks and write Kubernetes manifests.

No cluster, Docker engine or Pulumi CLI is involved. Config is assembled the way the CLI
would: ``Pulumi.yaml`` defaults (applied by :func:`infra.config_load.parse`), then
``Pulumi.<stack>.yaml``, then ``--set`` overrides. Values a stack file stores encrypted
(``secure: ...``) and secret keys left unset are replaced by a placeholder, so rendering
never needs, nor shows, a real secret; Secret payloads are redacted in the output.

Each Kubernetes resource the program declares (Docker images are not manifests) becomes
one file ``NN-<kind>-<name>.yaml``, where ``NN`` ranks the kind in apply order
(Namespace first, workloads later), so ``kubectl apply -f DIR`` and a file-by-file diff
are both stable: adding a cube shard adds files and never renames existing ones.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from infra.config import PROJECT, REPO_ROOT, REQUIRED_SECRETS, ConfigError
from infra.config_load import unknown_keys

REDACTED = "[redacted]"
#: stands in for every secret during rendering (long enough to pass validation)
SECRET_PLACEHOLDER = "render-placeholder-not-a-secret"

#: apply order of kinds; unknown kinds sort last (99)
KIND_ORDER = {
    "Namespace": 0, "Secret": 1, "ServiceAccount": 1, "NetworkPolicy": 1, "ConfigMap": 2, "PersistentVolumeClaim": 3, "Service": 4,
    "StatefulSet": 5, "Deployment": 6, "PodDisruptionBudget": 7,
    "HorizontalPodAutoscaler": 8, "Job": 9, "ServiceMonitor": 10, "PodMonitor": 10, "PrometheusRule": 10,
}
#: the file :func:`write` names each manifest's dependencies in
DEPENDENCIES = "dependencies.json"
_FILE_RE = re.compile(r"^\d\d-[a-z0-9.-]+\.yaml$")


@dataclass
class Manifest:
    """One rendered Kubernetes object: ``body`` is the manifest dict (secrets redacted)."""

    kind: str
    name: str
    body: dict
    #: the registration's URN (``""`` when built by hand)
    urn: str = ""
    #: file names of the manifests this one depends on (``pulumi up`` creates/updates and
    #: awaits them first; deletes run in the reverse order)
    depends_on: tuple[str, ...] = ()
    #: resource options a preview needs: ``replaceOnChanges``, ``ignoreChanges`` (property
    #: paths), ``deleteBeforeReplace``, ``customTimeouts`` (``{"update": "30m"}``)
    options: dict = field(default_factory=dict)

    @property
    def filename(self) -> str:
        """``NN-<kind lowercase>-<metadata.name>.yaml``."""
        return f"{KIND_ORDER.get(self.kind, 99):02d}-{self.kind.lower()}-{self.name}.yaml"


@dataclass
class Rendering:
    """What one render produced: manifests in file order, stack outputs, all resources."""

    stack: str
    config: dict[str, str]
    manifests: list[Manifest]
    outputs: dict[str, Any]
    #: every registration: urn, type, name, parent_type, inputs (components and images too)
    resources: list[dict] = field(default_factory=list)

    def by_kind(self, kind: str) -> list[Manifest]:
        """The manifests of one kind, in file order."""
        return [m for m in self.manifests if m.kind == kind]

    def dependencies(self) -> dict[str, list[str]]:
        """``{file name: [file names it depends on]}`` for every manifest (file order)."""
        return {m.filename: sorted(m.depends_on) for m in self.manifests}

    def get(self, kind: str, name: str) -> dict:
        """The manifest body of ``kind``/``name``; KeyError when absent."""
        for m in self.manifests:
            if m.kind == kind and m.name == name:
                return m.body
        raise KeyError(f"{kind}/{name}")


class RenderError(RuntimeError):
    """A stack file is missing or malformed, or an override is not ``key=value``."""


# ----------------------------------------------------------------------------- config
def stack_config(stack: str, overrides: Sequence[str] = (), project_dir: Path = REPO_ROOT,
                 ) -> tuple[dict[str, str], set[str]]:
    """The ``elastic-ctr:*`` config of ``stack`` as the CLI would pass it to the program.

    Returns ``(config, secret_keys)`` with fully qualified keys (``elastic-ctr:trainers``)
    and string values. Raises :class:`RenderError`.
    """
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise RenderError(f"no stack file {path} (stacks: "
                          f"{', '.join(sorted(p.name[7:-5] for p in project_dir.glob('Pulumi.*.yaml')))})")
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise RenderError(f"{path}: expected a mapping with a 'config:' mapping")
    config: dict[str, str] = {}
    secrets: set[str] = set()
    prefix = f"{PROJECT}:"
    for key, value in (doc.get("config") or {}).items():
        if not str(key).startswith(prefix):
            continue  # provider or other namespaces' settings (e.g. kubernetes:context)
        if isinstance(value, dict) and "secure" in value:
            config[key], _ = SECRET_PLACEHOLDER, secrets.add(key)
        else:
            config[key] = _to_config_string(value)
    for item in overrides:
        if "=" not in item:
            raise RenderError(f"--set {item!r}: expected key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        key = key if key.startswith(prefix) else prefix + key
        config[key] = value
    for key in REQUIRED_SECRETS:  # not with modelRoot: the stack then needs no upload token
        full = prefix + key
        if full not in config and not config.get(prefix + "modelRoot"):
            config[full], _ = SECRET_PLACEHOLDER, secrets.add(full)
    errors = unknown_keys(k[len(prefix):] for k in config)
    if errors:  # `pulumi up` passes them in the environment, where the program finds them
        raise ConfigError(errors)
    return config, secrets


def _to_config_string(value: Any) -> str:
    """Pulumi hands the program every config value as a string (objects as JSON)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "" if value is None else str(value)


# ----------------------------------------------------------------------------- mocks
class _EchoMocks:
    """Pulumi mocks that echo a resource's inputs back as its outputs (plus a stand-in
    digest for a pushed image)."""

    def new_resource(self, args):
        state = dict(args.inputs)
        if args.typ == "docker:index/image:Image":
            import hashlib

            name = state.get("imageName", "")
            state["repoDigest"] = f"{name.rsplit(':', 1)[0]}@sha256:{hashlib.sha256(name.encode()).hexdigest()}"
        if args.typ == "random:index/randomPassword:RandomPassword":  # a generated credential: a placeholder
            state["result"] = SECRET_PLACEHOLDER
        return f"{args.name}-id", state

    def call(self, args):
        return {}


def run_program(config: Mapping[str, str], secret_keys: set[str], stack: str,
                program: Optional[Callable[[], dict]] = None) -> tuple[list[dict], dict[str, Any]]:
    """Runs ``program`` (default :func:`infra.program.build`) under fresh Pulumi mocks in
    this process, through Pulumi's public testing API (``reset_options``, ``set_mocks``,
    ``set_all_config``, ``pulumi.runtime.test``, ``MockMonitor.get_registered_resources``).

    Returns (registrations in order, resolved stack outputs). Safe to call repeatedly.
    Raises whatever the program raises (e.g. :class:`infra.config.ConfigError`).
    """
    import pulumi
    from pulumi.runtime.mocks import MockMonitor

    if program is None:
        from infra.program import build as program

    class Mocks(_EchoMocks, pulumi.runtime.Mocks):
        pass

    class Monitor(MockMonitor):
        """Also records each registration's dependencies (URNs: explicit ``depends_on``
        and those of its inputs; a local component stands for its children)."""

        def __init__(self, mocks):
            super().__init__(mocks)
            self.dependencies: dict[str, list[str]] = {}
            self.options: dict[str, dict] = {}

        def RegisterResource(self, request):
            response = super().RegisterResource(request)
            self.dependencies[response.urn] = sorted(set(request.dependencies))
            self.options[response.urn] = {
                "replaceOnChanges": list(request.replaceOnChanges),
                "ignoreChanges": list(request.ignoreChanges),
                "deleteBeforeReplace": bool(request.deleteBeforeReplace),
                "customTimeouts": {k: getattr(request.customTimeouts, k) for k in ("create", "update", "delete")
                                   if getattr(request.customTimeouts, k)}}
            return response

    mocks = Mocks()
    monitor = Monitor(mocks)
    pulumi.runtime.reset_options(project=PROJECT, stack=stack, preview=False)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(dict(config), sorted(secret_keys))
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def run():
        return pulumi.Output.from_input(program()).apply(outputs.update)

    try:
        run()
    finally:
        pulumi.runtime.set_all_config({}, [])
    return ([_registration(r, monitor.dependencies.get(r.urn, []), monitor.options.get(r.urn, {}))
             for r in monitor.get_registered_resources().values()], _plain(outputs))


def _registration(reg, dependencies: Sequence[str] = (), options: Optional[dict] = None) -> dict:
    """A MockMonitor registration as a dict: urn, type, name, parent_type, inputs,
    dependencies (URNs of the resources it waits for under ``pulumi up``), options (its
    ``replaceOnChanges``, ``ignoreChanges``, ``deleteBeforeReplace``: what a preview
    needs besides the inputs; ``customTimeouts``: how long ``pulumi up`` awaits it).

    The URN encodes the parent chain, e.g.
    ``urn:pulumi:dev::elastic-ctr::elastic-ctr:index:CubeCluster$kubernetes:apps/v1:StatefulSet::cube-2s-shard-0``.
    """
    head, name = reg.urn.rsplit("::", 1)
    chain = head.split("::", 2)[2].split("$")
    return {"urn": reg.urn, "type": chain[-1], "name": name,
            "parent_type": chain[-2] if len(chain) > 1 else None,
            "inputs": copy.deepcopy(dict(reg.state or {})), "dependencies": list(dependencies),
            "options": dict(options or {})}


def _plain(value: Any) -> Any:
    """Outputs as plain JSON-able data (tuples -> lists)."""
    return json.loads(json.dumps(value, default=str))


# ----------------------------------------------------------------------------- manifests
def to_manifest(resource: dict) -> Optional[Manifest]:
    """The Kubernetes manifest of a recorded registration, or None for non-Kubernetes ones."""
    if not resource["type"].startswith("kubernetes:"):
        return None
    body = _clean(resource["inputs"])
    if not isinstance(body, dict) or "kind" not in body:
        return None
    body = _redact(body)
    ordered = {k: body[k] for k in ("apiVersion", "kind", "metadata") if k in body}
    ordered.update({k: v for k, v in body.items() if k not in ordered})
    return Manifest(kind=body["kind"], name=body["metadata"]["name"], body=ordered, urn=resource.get("urn", ""),
                    options=dict(resource.get("options") or {}))


_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"  # pulumi's marker of a secret value
_SIG_KEY = "4dabf18193072939515e22adb298388d"


def _clean(value: Any) -> Any:
    """Normalizes mock inputs into a manifest: drops unset (None) values, redacts values
    Pulumi marks secret, turns integral floats (the wire format has only doubles) back
    into ints and sorts keys so the text is stable."""
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            inner = value.get("value")
            # keep a secret map's keys (a Secret's stringData stays a valid object)
            return {k: REDACTED for k in sorted(inner)} if isinstance(inner, dict) else REDACTED
        return {k: _clean(value[k]) for k in sorted(value) if value[k] is not None}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _redact(body: dict) -> dict:
    """Replaces every Secret payload value by ``[redacted]``."""
    if body.get("kind") == "Secret":
        for key in ("data", "stringData"):
            if isinstance(body.get(key), dict):
                body[key] = {k: REDACTED for k in body[key]}
    return body


def render(stack: str, overrides: Sequence[str] = (), project_dir: Path = REPO_ROOT,
           ) -> Rendering:
    """Renders ``stack`` (plus ``key=value`` overrides) to manifests, in memory.

    Raises :class:`RenderError` for a missing stack file or bad override, and
    :class:`infra.config.ConfigError` for invalid config.
    """
    config, secrets = stack_config(stack, overrides, project_dir)
    resources, outputs = run_program(config, secrets, stack)
    manifests = [m for m in (to_manifest(r) for r in resources) if m is not None]
    by_urn = {m.urn: m for m in manifests}
    for m, r in zip(manifests, (r for r in resources if r["urn"] in by_urn)):
        m.depends_on = tuple(sorted({by_urn[u].filename for u in r["dependencies"] if u in by_urn}))
    names = [m.filename for m in manifests]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise RenderError(f"two resources render to the same file: {sorted(dupes)}")
    manifests.sort(key=lambda m: m.filename)
    return Rendering(stack=stack, config=config, manifests=manifests, outputs=outputs,
                     resources=resources)


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (e.g. topology.json) as ``|`` literals."""


def _str_representer(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(body: dict) -> str:
    """Stable YAML text of a manifest (keys in insertion order, block style)."""
    return yaml.dump(body, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def write(rendering: Rendering, out_dir: Path) -> list[Path]:
    """Writes one file per manifest plus ``outputs.json`` and ``dependencies.json``
    (``{file: [files it depends on]}``, :meth:`Rendering.dependencies`) into ``out_dir``.

    Files a previous render left there (``NN-*.yaml``, the two JSON files) are removed first,
    so a shrunken stack leaves no stale manifest; other files are left alone.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        if old.is_file() and (_FILE_RE.match(old.name) or old.name in ("outputs.json", DEPENDENCIES)):
            old.unlink()
    written = []
    for m in rendering.manifests:
        path = out_dir / m.filename
        path.write_text(dump(m.body))
        written.append(path)
    outputs = out_dir / "outputs.json"
    outputs.write_text(json.dumps(rendering.outputs, indent=2, sort_keys=True) + "\n")
    deps = out_dir / DEPENDENCIES
    deps.write_text(json.dumps(rendering.dependencies(), indent=2) + "\n")
    return written + [outputs, deps]
