"""Reading a rendering into the run's store: every manifest validated against the schema
(before any container starts), one namespace, Secrets (redacted values replaced),
ConfigMaps, claims, Services and workloads."""
from __future__ import annotations

import base64
import json
import secrets as _secrets
from pathlib import Path
from typing import Any, Optional

import yaml

from tests.containers.kube.errors import UnsupportedField
from tests.containers.kube.objects import Workload
from tests.containers.kube.schema import validate
from tests.containers.kube.store import Store

REDACTED = "[redacted]"  # infra.render.REDACTED: a Secret value the rendering hides


def bodies(manifests: Any) -> list[tuple[str, dict]]:
    """``(where, body)`` pairs of manifest bodies (dicts), an ``infra.render.Rendering``, or a
    directory of rendered ``NN-*.yaml`` files."""
    if hasattr(manifests, "manifests"):  # infra.render.Rendering
        return [(m.filename, m.body) for m in manifests.manifests]
    if isinstance(manifests, (str, Path)):
        d = Path(manifests)
        return [(p.name, yaml.safe_load(p.read_text())) for p in sorted(d.glob("[0-9][0-9]-*.yaml"))]
    return [(f"manifest[{i}]", b) for i, b in enumerate(manifests)]


def dependencies(manifests: Any) -> dict[str, list[str]]:
    """``{file name: [file names it depends on]}`` of a rendering: an
    ``infra.render.Rendering``'s ``Manifest.depends_on``, or a rendered directory's
    ``dependencies.json``; ``{}`` when unknown (bodies given as dicts, an older rendering):
    file order alone then orders ``Cluster.apply``."""
    if hasattr(manifests, "manifests"):
        return {m.filename: list(getattr(m, "depends_on", ()) or ()) for m in manifests.manifests}
    if isinstance(manifests, (str, Path)) and (Path(manifests) / "dependencies.json").is_file():
        return json.loads((Path(manifests) / "dependencies.json").read_text())
    return {}


def check(store: Store, docs: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    """Validates ``docs`` against the schema and the run's one namespace (the first
    Namespace of ``docs``, else ``store.namespace``); returns the ignored ``(path, reason)``
    pairs. Raises UnsupportedField (an unknown field, a second namespace, a Service port the
    harness cannot play)."""
    ignored: list[tuple[str, str]] = []
    for where, body in docs:
        ignored += validate(body, f"{body.get('kind')}/{body.get('metadata', {}).get('name')}")
    namespaces = [b["metadata"]["name"] for _, b in docs if b["kind"] == "Namespace"]
    namespace = namespaces[0] if namespaces else store.namespace
    for _, b in docs:
        ns = b.get("metadata", {}).get("namespace")
        if (b["kind"] != "Namespace" and ns and ns != namespace) or (b["kind"] == "Namespace" and ns != namespace
                                                                      and b["metadata"]["name"] != namespace):
            raise UnsupportedField(f"{b['kind']}/{b['metadata']['name']}.metadata.namespace={ns!r}",
                                   f"one namespace per run ({namespace})")
        if b["kind"] == "Service":
            check_service(b)
    return ignored


def load(store: Store, docs: list[tuple[str, dict]], secret_values: Optional[dict] = None) -> None:
    """Validates ``docs`` (``check``) and fills ``store`` (workloads are added, not yet planned).

    ``secret_values``: ``{(secret, key): value}`` for values the rendering redacted; others
    get a random value (48 hex characters, the same for every pod of the run). Raises
    UnsupportedField (an unknown field, a second namespace, a non-Filesystem claim, a
    Service port the harness cannot play)."""
    store.ignored += check(store, docs)
    namespaces = [b["metadata"]["name"] for _, b in docs if b["kind"] == "Namespace"]
    if namespaces:
        store.namespace = namespaces[0]
    for _, b in docs:
        if b["kind"] in ("Deployment", "StatefulSet", "Job"):
            store.workloads[b["metadata"]["name"]] = Workload(b["kind"], b["metadata"]["name"], b)
        else:
            put(store, b, secret_values)


def put(store: Store, b: dict, secret_values: Optional[dict] = None) -> None:
    """Stores one Secret, ConfigMap, claim or Service (created or updated) as the API server
    would hold it; other kinds (Namespace, budgets, autoscalers, workloads) are left alone.
    A redacted Secret value keeps the value the run already has for it, else takes
    ``secret_values[(secret, key)]``, else a random one. Raises UnsupportedField for a claim
    that is not a Filesystem volume."""
    kind, name = b["kind"], b["metadata"]["name"]
    if kind == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in (b.get("data") or {}).items()}
        data.update(b.get("stringData") or {})
        known = store.secrets.get(name, {})
        for k, v in data.items():
            if v == REDACTED:
                data[k] = known.get(k) or (secret_values or {}).get((name, k)) or _secrets.token_hex(24)
        store.secrets[name] = data
    elif kind == "ConfigMap":
        data = dict(b.get("data") or {})
        for k, v in (b.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v).decode("latin-1")
        store.configmaps[name] = data
    elif kind == "PersistentVolumeClaim":
        mode = (b.get("spec") or {}).get("volumeMode", "Filesystem")
        if mode != "Filesystem":
            raise UnsupportedField(f"PersistentVolumeClaim/{name}.spec.volumeMode={mode!r}")
        store.claims.setdefault(name, store.workdir / "claims" / name)
    elif kind == "Service":
        check_service(b)
        store.services[name] = b


def remove(store: Store, b: dict) -> None:
    """Forgets one Secret, ConfigMap, claim or Service (a claim's host directory stays: the
    claims of a run are kept, as a ``Retain`` volume would be)."""
    kind, name = b["kind"], b["metadata"]["name"]
    table = {"Secret": store.secrets, "ConfigMap": store.configmaps, "PersistentVolumeClaim": store.claims,
             "Service": store.services}.get(kind)
    if table is not None:
        table.pop(name, None)


def check_service(b: dict) -> None:
    """Refuses a Service port that is not TCP, or whose numeric ``targetPort`` differs from
    ``port`` (Service names resolve to pod addresses: ports cannot be translated)."""
    for i, p in enumerate(b["spec"].get("ports", [])):
        if p.get("protocol", "TCP") != "TCP":
            raise UnsupportedField(f"Service/{b['metadata']['name']}.spec.ports[{i}].protocol={p['protocol']!r}")
        target = p.get("targetPort", p["port"])
        if isinstance(target, int) and target != p["port"]:
            raise UnsupportedField(
                f"Service/{b['metadata']['name']}.spec.ports[{i}].targetPort={target}",
                f"differs from port {p['port']}: Service names resolve to pod addresses, so ports cannot "
                "be translated")
