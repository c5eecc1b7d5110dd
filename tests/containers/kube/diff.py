"""The difference between the rendering a cluster runs and a new one, as the steps `pulumi
up` would take (pure: no engine, no store).

Objects are matched by ``(kind, namespace, name)``. Each object of the new rendering is
``create`` (absent before), ``update`` (its body differs), ``replace`` (a field the API
server does not let an update change differs: ``REPLACE_ON``) or unchanged (no step); each
object only in the old rendering is ``delete``. Pulumi's engine performs creates, updates
and replaces in dependency order and every delete after them, in reverse dependency order
(pulumi docs, "How Pulumi works": resources no longer in the program are deleted at the end
of the update). The program's dependency order is the rendering's file order
(``NN-<kind>-<name>.yaml``: Namespace, Secrets, ConfigMaps, claims, Services,
StatefulSets, Deployments, budgets, Jobs; ``infra.render.KIND_ORDER``), which is also
the order ``kubectl apply -f DIR`` uses. A ``replace`` of an object with a fixed
``metadata.name`` is delete-then-create (pulumi-kubernetes cannot create a second object
under the same name, so it deletes first).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

#: the fields whose change the API server refuses as an update (immutable), per kind: a
#: change there is a replacement (Kubernetes API reference: StatefulSetSpec "only replicas,
#: ordinals, template, updateStrategy, persistentVolumeClaimRetentionPolicy and
#: minReadySeconds may be updated"; DeploymentSpec.selector immutable in apps/v1;
#: PersistentVolumeClaimSpec immutable after creation except resources.requests; a Volcano
#: Job's tasks cannot be changed: the program replaces the job)
REPLACE_ON: dict[str, tuple[str, ...]] = {
    "StatefulSet": ("spec.selector", "spec.serviceName", "spec.volumeClaimTemplates", "spec.podManagementPolicy"),
    "Deployment": ("spec.selector",),
    "PersistentVolumeClaim": ("spec.accessModes", "spec.storageClassName", "spec.volumeMode"),
    "Job": ("spec",),
    "Service": ("spec.clusterIP",),
    "Namespace": ("metadata.name",),
}
ACTIONS = ("create", "update", "replace", "delete")


def object_key(body: dict, namespace: str = "default") -> tuple[str, str, str]:
    """``(kind, namespace, name)`` of a manifest; a namespaced object without a namespace is
    in ``namespace``; a Namespace's own namespace is ``""``. Raises ValueError naming what is
    missing."""
    kind = body.get("kind")
    name = (body.get("metadata") or {}).get("name")
    if not kind or not name:
        raise ValueError(f"manifest without kind or metadata.name: {str(body)[:200]}")
    ns = "" if kind == "Namespace" else ((body.get("metadata") or {}).get("namespace") or namespace)
    return kind, ns, name


def changed_paths(old: Any, new: Any, prefix: str = "", limit: int = 40) -> list[str]:
    """The dotted paths (``spec.template.spec.containers[0].args``) where ``old`` and ``new``
    differ, deepest first differing object or list level; at most ``limit``."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(out) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and isinstance(a[0], (dict, list)):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        else:
            out.append(path or "(whole object)")

    walk(old, new, prefix)
    return out


@dataclass(frozen=True)
class Change:
    """One step: ``action`` (``create``, ``update``, ``replace``, ``delete``) of the object
    ``kind``/``name`` in ``namespace``; ``old``/``new`` are its bodies (None where absent);
    ``paths`` the changed fields of an update or replace."""

    action: str
    kind: str
    namespace: str
    name: str
    old: Optional[dict] = field(default=None, compare=False, repr=False)
    new: Optional[dict] = field(default=None, compare=False, repr=False)
    paths: tuple[str, ...] = ()

    def __str__(self) -> str:
        s = f"{self.action} {self.kind}/{self.name}"
        if self.paths:
            s += " (" + ", ".join(self.paths[:6]) + (", ..." if len(self.paths) > 6 else "") + ")"
        return s


def _canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def _touches(paths: Iterable[str], prefixes: Iterable[str]) -> bool:
    return any(p == q or p.startswith(q + ".") or p.startswith(q + "[") for p in paths for q in prefixes)


def diff(old: list[dict], new: list[dict], namespace: str = "default") -> list[Change]:
    """The steps from the rendering ``old`` to ``new`` (manifest bodies, each list in its
    rendering's file order): creates, updates and replaces in ``new``'s order, then deletes
    in the reverse of ``old``'s order. Unchanged objects give no step. Raises ValueError for
    an object that appears twice in one rendering (naming it)."""
    def index(docs: list[dict], which: str) -> dict[tuple[str, str, str], dict]:
        out: dict[tuple[str, str, str], dict] = {}
        for b in docs:
            k = object_key(b, namespace)
            if k in out:
                raise ValueError(f"{which} rendering holds {k[0]}/{k[2]} twice")
            out[k] = b
        return out

    before, after = index(old, "the old"), index(new, "the new")
    steps: list[Change] = []
    for k, body in after.items():
        prev = before.get(k)
        if prev is None:
            steps.append(Change("create", *k, old=None, new=body))
        elif _canonical(prev) != _canonical(body):
            paths = tuple(changed_paths(prev, body))
            action = "replace" if _touches(paths, REPLACE_ON.get(k[0], ())) else "update"
            steps.append(Change(action, *k, old=prev, new=body, paths=paths))
    for k in reversed(list(before)):
        if k not in after:
            steps.append(Change("delete", *k, old=before[k], new=None))
    return steps


def dependency_order(docs: list[tuple[str, dict]], depends_on: dict[str, Iterable[str]]) -> list[tuple[str, dict]]:
    """``docs`` (``(file name, body)`` in file order) ordered so that each comes after what it
    depends on (``depends_on``: file name -> file names, as ``infra.render`` records the
    program's dependencies); among objects free to go, file order decides (a stable
    topological sort). A dependency outside ``docs`` is ignored. Raises ValueError naming the
    objects of a dependency cycle."""
    names = [w for w, _ in docs]
    pos = {w: i for i, w in enumerate(names)}
    waits = {w: {d for d in depends_on.get(w, ()) if d in pos and d != w} for w in names}
    done: set[str] = set()
    out: list[tuple[str, dict]] = []
    by_name = dict(docs)
    while len(out) < len(docs):
        free = [w for w in names if w not in done and waits[w] <= done]
        if not free:
            raise ValueError(f"dependency cycle among {sorted(w for w in names if w not in done)}")
        w = min(free, key=pos.__getitem__)
        done.add(w)
        out.append((w, by_name[w]))
    return out
