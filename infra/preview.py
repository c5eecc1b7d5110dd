"""What ``pulumi up`` would do to go from one rendering to another, in the words of
``pulumi preview --diff``: each Kubernetes resource is created (``+``), updated (``~``),
replaced (``+-``) or deleted (``-``), with the property paths that changed.

How each change is classified follows pulumi-kubernetes's provider (v4,
``provider/pkg/provider/diff.go``, ``forceNewProperties``): a change under one of a kind's
force-new properties (``metadata.name``/``namespace`` for all; a StatefulSet's
``spec.selector``, ``spec.serviceName``, ``spec.podManagementPolicy``,
``spec.revisionHistoryLimit``, ``spec.volumeClaimTemplates``; a Deployment's
``spec.selector``; a batch/v1 Job's ``spec.template``, ``spec.selector``,
``spec.completions``, ``spec.parallelism``; a PVC's ``spec.accessModes``,
``spec.storageClassName``, ``spec.selector``, ``spec.volumeName``; a Service's
``spec.clusterIP``; a ConfigMap's ``data``/``binaryData`` unless the stack sets
``kubernetes:enableConfigMapMutable``; a Secret's ``type``/``data``/``stringData``) or under
one of the resource's own ``replaceOnChanges`` paths is a replace, any other change an
update; paths under the resource's ``ignoreChanges`` are left out. Resources are matched
by kind and name (the program names each Kubernetes object after its Pulumi resource).

Order, as the engine runs the steps: creates, updates and replaces in the new
rendering's file order (checked to be a dependency order: ``dependencies.json``), then
the deletes of what left the program, in reverse file order of the old one.

Not modelled: changes the cluster made (pulumi diffs against its state, this against the
old rendering), values only known after apply, and Secret payloads (redacted on both
sides, so never shown as changed).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import yaml

from infra.render import DEPENDENCIES, Manifest, Rendering

#: ``pulumi preview`` symbols
SYMBOLS = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}

_FORCE_NEW_COMMON = ("metadata.name", "metadata.namespace")
#: (apiVersion, kind) -> property paths whose change replaces the object (pulumi-kubernetes v4)
FORCE_NEW: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps/v1", "StatefulSet"): ("spec.podManagementPolicy", "spec.revisionHistoryLimit", "spec.selector",
                                 "spec.serviceName", "spec.volumeClaimTemplates"),
    ("apps/v1", "Deployment"): ("spec.selector",),
    ("apps/v1", "DaemonSet"): ("spec.selector",),
    ("batch/v1", "Job"): ("spec.completions", "spec.parallelism", "spec.selector", "spec.template"),
    ("v1", "PersistentVolumeClaim"): ("spec.accessModes", "spec.selector", "spec.storageClassName",
                                      "spec.volumeName"),
    ("v1", "Service"): ("spec.clusterIP",),
    ("v1", "Secret"): ("type", "data", "stringData"),
}
_CONFIGMAP_DATA = ("data", "binaryData")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Change:
    """One changed property: ``op`` ``+`` (added), ``-`` (removed) or ``~`` (changed);
    ``path`` as a list of keys (str) and indices (int)."""

    op: str
    path: tuple[Union[str, int], ...]

    @property
    def text(self) -> str:
        """The path as pulumi prints property paths: ``spec.template.metadata.annotations["a/b"]``,
        list indices as ``[i]``."""
        out = ""
        for part in self.path:
            if isinstance(part, int):
                out += f"[{part}]"
            elif _IDENT.match(part):
                out += f".{part}" if out else part
            else:
                out += f'["{part}"]'
        return out


@dataclass(frozen=True)
class Step:
    """One step of the preview: ``op`` create | update | replace | delete of the Kubernetes
    object ``kind``/``name`` (Pulumi type ``token``); ``changes`` for update and replace;
    ``replace_because``: the changed paths that force the replacement;
    ``delete_before_replace``: the old object goes before the new one is created."""

    op: str
    token: str
    kind: str
    name: str
    changes: tuple[Change, ...] = ()
    replace_because: tuple[str, ...] = ()
    delete_before_replace: bool = False

    @property
    def paths(self) -> set[str]:
        """The changed paths as text."""
        return {c.text for c in self.changes}

    def line(self) -> str:
        """``<symbol> <type token> <name> (<op>)`` plus ``[diff: ...]`` for updates and replaces."""
        text = f"{SYMBOLS[self.op]:<2} {self.token} {self.name} ({self.op})"
        if self.changes:
            text += " [diff: " + ", ".join(f"{c.op}{c.text}" for c in self.changes) + "]"
        if self.op == "replace":
            text += " [replace: " + ", ".join(self.replace_because) + "]"
            if self.delete_before_replace:
                text += " [delete before replace]"
        return text


def type_token(api_version: str, kind: str) -> str:
    """The Pulumi type of a Kubernetes object: ``kubernetes:<group or core>/<version>:<Kind>``."""
    group, _, version = api_version.rpartition("/")
    return f"kubernetes:{group or 'core'}/{version}:{kind}"


def changes(old: Any, new: Any, path: tuple = ()) -> list[Change]:
    """The property-level differences of two manifest values (dicts by key, lists by
    index), in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for key in sorted(set(old) | set(new)):
            if key not in old:
                out.append(Change("+", path + (key,)))
            elif key not in new:
                out.append(Change("-", path + (key,)))
            else:
                out += changes(old[key], new[key], path + (key,))
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = []
        for i in range(max(len(old), len(new))):
            if i >= len(old):
                out.append(Change("+", path + (i,)))
            elif i >= len(new):
                out.append(Change("-", path + (i,)))
            else:
                out += changes(old[i], new[i], path + (i,))
        return out
    return [] if old == new else [Change("~", path)]


def _under(path: tuple, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` (dotted keys) or below it."""
    want = prefix.split(".")
    return [str(p) for p in path[:len(want)]] == want


def force_new(manifest: Manifest, configmap_mutable: bool) -> tuple[str, ...]:
    """The property paths whose change replaces ``manifest`` (its kind's and its own
    ``replaceOnChanges``)."""
    api, kind = manifest.body.get("apiVersion", ""), manifest.kind
    props = _FORCE_NEW_COMMON + FORCE_NEW.get((api, kind), ())
    if (api, kind) == ("v1", "ConfigMap") and not configmap_mutable:
        props += _CONFIGMAP_DATA
    return props + tuple(manifest.options.get("replaceOnChanges", ()))


def step(old: Optional[Manifest], new: Optional[Manifest], configmap_mutable: bool = True) -> Optional[Step]:
    """The step taking ``old`` to ``new`` (None: absent on that side); None when nothing changed."""
    if old is None and new is None:
        raise ValueError("step: old and new are both None")
    ref = new or old
    token = type_token(ref.body.get("apiVersion", ""), ref.kind)
    if old is None:
        return Step("create", token, ref.kind, ref.name)
    if new is None:
        return Step("delete", token, ref.kind, ref.name)
    ignored = new.options.get("ignoreChanges", ())
    diff = tuple(c for c in changes(old.body, new.body) if not any(_under(c.path, p) for p in ignored))
    if not diff:
        return None
    because = tuple(sorted({p for c in diff for p in force_new(new, configmap_mutable) if _under(c.path, p)}))
    if because:
        # pulumi-kubernetes deletes first when the replacement keeps an explicit name (all
        # of ours do), as does a resource's own deleteBeforeReplace option
        return Step("replace", token, ref.kind, ref.name, diff, because, delete_before_replace=True)
    return Step("update", token, ref.kind, ref.name, diff)


def preview(before: Union[Rendering, Iterable[Manifest]], after: Union[Rendering, Iterable[Manifest]],
            configmap_mutable: bool = True) -> list[Step]:
    """The steps ``pulumi up`` takes from ``before`` to ``after`` (see the module docstring
    for the rules and the order). Every object here is explicitly named, so a replace is
    delete-before-replace (pulumi-kubernetes cannot create a second object of that name)."""
    old = {(m.kind, m.name): m for m in _manifests(before)}
    new = _manifests(after)
    steps = [s for m in new if (s := step(old.get((m.kind, m.name)), m, configmap_mutable))]
    gone = {(m.kind, m.name) for m in new}
    steps += [step(m, None) for m in reversed(list(old.values())) if (m.kind, m.name) not in gone]
    return steps


def summary(steps: list[Step], unchanged: int) -> str:
    """``Resources: +N to create, ~N to update, +-N to replace, -N to delete, N unchanged``."""
    counts = {op: sum(s.op == op for s in steps) for op in SYMBOLS}
    parts = [f"{SYMBOLS[op]}{n} to {op}" for op, n in counts.items() if n]
    return "Resources: " + ", ".join(parts + [f"{unchanged} unchanged"])


def report(before: Union[Rendering, Iterable[Manifest]], after: Rendering, configmap_mutable: bool = True) -> str:
    """The preview as text: one line per step, then the summary."""
    steps = preview(before, after, configmap_mutable)
    touched = {(s.kind, s.name) for s in steps if s.op != "delete"}
    unchanged = sum((m.kind, m.name) not in touched for m in after.manifests)
    return "\n".join([*(s.line() for s in steps), summary(steps, unchanged)])


def _manifests(source: Union[Rendering, Iterable[Manifest]]) -> list[Manifest]:
    """Manifests in file order."""
    items = source.manifests if isinstance(source, Rendering) else list(source)
    return sorted(items, key=lambda m: m.filename)


def load_dir(directory: Path) -> list[Manifest]:
    """The manifests a rendering wrote to ``directory`` (``NN-*.yaml``, plus each one's
    dependencies from ``dependencies.json`` when present), in file order. Raises
    FileNotFoundError when it holds no manifest, ValueError naming a file that is not one."""
    directory = Path(directory)
    paths = sorted(directory.glob("[0-9][0-9]-*.yaml"))
    if not paths:
        raise FileNotFoundError(f"{directory}: no rendered manifests (NN-*.yaml)")
    deps_file = directory / DEPENDENCIES
    deps = json.loads(deps_file.read_text()) if deps_file.is_file() else {}
    out = []
    for path in paths:
        body = yaml.safe_load(path.read_text())
        if not isinstance(body, dict) or "kind" not in body or "name" not in body.get("metadata", {}):
            raise ValueError(f"{path}: not a Kubernetes manifest (kind and metadata.name)")
        out.append(Manifest(kind=body["kind"], name=body["metadata"]["name"], body=body,
                            depends_on=tuple(deps.get(path.name, ()))))
    return out


def configmap_mutable(stack_file: Path) -> bool:
    """Whether ``Pulumi.<stack>.yaml`` sets ``kubernetes:enableConfigMapMutable`` true (then
    a ConfigMap's data changes in place; else the provider replaces the ConfigMap)."""
    doc = yaml.safe_load(Path(stack_file).read_text()) or {}
    value = (doc.get("config") or {}).get("kubernetes:enableConfigMapMutable", False)
    return value is True or str(value).lower() == "true"
