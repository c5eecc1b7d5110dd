"""``Cluster.apply(new rendering)``: a new rendering applied to the running one the way
``pulumi up`` applies a changed program.

What it plays
-------------
* **The steps** (``diff``): objects matched by kind/namespace/name; creates, updates and
  replaces in dependency order (the rendering's recorded dependencies, else its file order,
  which ranks kinds as ``kubectl apply -f DIR`` does), one at a time, each awaited before
  the next; deletes last, in reverse order. A replace of a named object is delete, then
  create (pulumi-kubernetes cannot hold two objects under one name).
* **The awaits** (pulumi-kubernetes' await logic, as its API docs state it):
  StatefulSet ready = ``spec.replicas`` pods exist, all ready, all at the update revision
  (``readyReplicas``/``currentReplicas`` = replicas, ``currentRevision`` = ``updateRevision``);
  Deployment ready = the new ReplicaSet's pods are all available and no old pod is left
  (``Available`` and ``Progressing: NewReplicaSetAvailable``); a Volcano Job (a custom
  resource: pulumi-kubernetes has no await logic for it) is done once created; ConfigMaps,
  Secrets, claims, Services, budgets are done at once. An await gives up after
  ``timeout_s`` (pulumi's default: 10 min) or at the first error the harness records
  (a pod that fails, exits on its own, fails its liveness probe).
* **The controllers.** StatefulSet (``updateStrategy`` RollingUpdate, the default, or
  OnDelete): scale up creates the missing ordinals in ordinal order (OrderedReady: each once
  the previous one is ready; Parallel: together), scale down deletes from the highest
  ordinal (OrderedReady: one at a time), then a changed template replaces the pods from the
  highest ordinal down to ``rollingUpdate.partition``, each deleted, recreated under its name
  with its claims, and ready before the next (the Kubernetes StatefulSet controller's
  order). Deployment: RollingUpdate with ``maxSurge`` (rounded up) and ``maxUnavailable``
  (rounded down) of ``replicas`` (defaults 25 %): new-template pods are created while the
  pods that exist stay within ``replicas + maxSurge``, and old pods are deleted (not-ready
  ones first, then the newest) while the ready pods stay at least ``replicas -
  maxUnavailable``; Recreate: every old pod is deleted and gone before the new ones are
  created. A scale without a template change adds or deletes pods directly (not-ready,
  then newest first), as a ReplicaSet does.
* **ConfigMaps and Secrets** are written into a pod's volume files and environment when the
  pod starts, so a change reaches a pod only when the pod is replaced (for env values that
  is Kubernetes' behaviour; a mounted ConfigMap's files the kubelet would also refresh in
  place within about a minute: not played, and nothing in the stack relies on it: the
  serving and transfer templates carry the topology's checksum, so a change rolls them).
* **Deletions** of workloads delete every pod the Kubernetes way (readiness false and out of
  the Service endpoints at once, preStop, SIGTERM, SIGKILL after the grace period), all at
  once, awaited until gone; a deleted claim's directory stays.

What it does not play
---------------------
* Pulumi runs independent steps in parallel; here they run one after the other in a
  dependency-respecting order, so a recorded time is an upper bound of ``pulumi up``'s.
* DNS is a hosts table fixed when a container starts (``dns``): a name created later is
  unknown to containers started before it. Each pod gets the table of the moment it
  starts; a StatefulSet pod recreated under its name keeps its address, and a Recreate
  Deployment's new pods take the old pods' addresses, so their names keep resolving; a
  RollingUpdate Deployment's new pods get new addresses (nothing in the stack resolves
  ``serving`` from inside the cluster).
* No rollback, revision history, ``minReadySeconds``, ``progressDeadlineSeconds`` or
  StatefulSet ``rollingUpdate.maxUnavailable``; a change of the namespace is refused.
* The old-pod deletions of a rolling update are awaited before the step ends (pulumi's
  Deployment await does not wait for terminating pods): again an upper bound.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from tests.containers.kube import dns
from tests.containers.kube import manifests as kmanifests
from tests.containers.kube.controllers import template_hash
from tests.containers.kube.diff import Change, dependency_order, diff
from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import Pod, Workload
from tests.containers.kube.records import Termination

WORKLOADS = ("Deployment", "StatefulSet", "Job")
#: seconds between two looks at the pods during a rollout
TICK_S = 0.2


@dataclass
class Step:
    """One applied change and how long it took (s), with what its controller did."""

    change: Change
    seconds: float
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.change} in {self.seconds:.1f} s" + (f": {self.detail}" if self.detail else "")


@dataclass
class ApplyReport:
    """What ``Cluster.apply`` did: its steps in order and the total time (s)."""

    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    terminations: list[Termination] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """How many creates, updates, replaces and deletes."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.change.action] = out.get(s.change.action, 0) + 1
        return out

    def summary(self) -> str:
        """One line per step, then the total."""
        return "\n".join([str(s) for s in self.steps] + [f"total {self.seconds:.1f} s {self.counts()}"])


def resolve_int_or_percent(value: Any, total: int, round_up: bool, default: str = "25%") -> int:
    """A Deployment's ``maxSurge``/``maxUnavailable``: an int, or ``"N%"`` of ``total``
    rounded up (surge) or down (unavailable), as the Deployment controller does. Raises
    UnsupportedField for another value."""
    value = default if value is None else value
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        x = int(value[:-1]) * total / 100
        return math.ceil(x) if round_up else math.floor(x)
    raise UnsupportedField(f"rollingUpdate value {value!r}", "an int or 'N%'")


class Applier:
    """Applies renderings to a started ``Cluster`` (it uses the cluster's store, kubelet,
    controllers and terminator)."""

    def __init__(self, cluster: Any):
        self.c = cluster
        self.store = cluster.store
        self.report: Optional[ApplyReport] = None
        self._images_ok: set[str] = set()

    # ------------------------------------------------------------------ entry
    def apply(self, manifests: Any, *, secret_values: Optional[dict] = None, timeout_s: float = 600.0
              ) -> ApplyReport:
        docs = kmanifests.bodies(manifests)
        docs = dependency_order(docs, kmanifests.dependencies(manifests))
        ignored = kmanifests.check(self.store, docs)
        namespaces = [b["metadata"]["name"] for _, b in docs if b["kind"] == "Namespace"]
        if namespaces and namespaces[0] != self.store.namespace:
            raise UnsupportedField(f"Namespace/{namespaces[0]}", f"the run's namespace is {self.store.namespace}")
        for where, b in docs:
            if b["kind"] in ("Deployment", "StatefulSet"):
                self.c.controllers._template_labels(Workload(b["kind"], b["metadata"]["name"], b),
                                                    b["spec"]["template"], where)
        changes = diff([b for _, b in self.c.applied], [b for _, b in docs], self.store.namespace)
        self.report = report = ApplyReport()
        t0 = time.monotonic()
        self.store.log(f"apply: {len(changes)} step(s): " + "; ".join(str(ch) for ch in changes))
        for ch in changes:
            t1 = time.monotonic()
            self.store.log(f"apply: {ch} ...")
            detail = self._step(ch, secret_values, timeout_s)
            step = Step(ch, time.monotonic() - t1, detail)
            report.steps.append(step)
            self.store.log(f"apply: {step}")
        report.seconds = time.monotonic() - t0
        self.c.applied = docs
        with self.store.lock:
            self.store.ignored += [i for i in ignored if i not in self.store.ignored]
        self.store.log(f"apply: done in {report.seconds:.1f} s {report.counts()}")
        return report

    def _step(self, ch: Change, secret_values: Optional[dict], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        if ch.kind not in WORKLOADS:
            if ch.action == "delete":
                kmanifests.remove(self.store, ch.old)
                return "removed (pods that started with it keep what they read)"
            else:
                kmanifests.put(self.store, ch.new, secret_values)
            if ch.kind in ("PodDisruptionBudget", "HorizontalPodAutoscaler", "Namespace", "ServiceMonitor",
                           "PodMonitor", "PrometheusRule", "ServiceAccount", "NetworkPolicy"):
                return "not played (schema.IGNORED)" if ch.kind != "Namespace" else ""
            return "stored; pods see it when they start"
        if ch.action == "delete":
            return self._delete_workload(ch.name)
        if ch.action == "replace":
            gone = self._delete_workload(ch.name)
            return f"{gone}; " + self._create(ch.new, deadline)
        if ch.action == "create":
            return self._create(ch.new, deadline)
        w = self.store.workloads[ch.name]
        if w.kind == "StatefulSet":
            return self._statefulset(w, ch.new, deadline)
        if w.kind == "Deployment":
            return self._deployment(w, ch.new, deadline)
        raise HarnessError(f"Job/{ch.name}: an update of a Volcano Job is a replace (diff.REPLACE_ON)")

    # ------------------------------------------------------------------ helpers
    def _check_images(self, body: dict) -> None:
        spec = body["spec"]
        templates = [t["template"] for t in spec["tasks"]] if body["kind"] == "Job" else [spec["template"]]
        for tpl in templates:
            for ctr in tpl["spec"].get("initContainers", []) + tpl["spec"]["containers"]:
                image = self.c.image_map.get(ctr["image"], ctr["image"])
                if image in self._images_ok:
                    continue
                if self.c.docker("image", "inspect", "--format", "{{.Id}}", image, check=False).returncode != 0:
                    raise HarnessError(f"{body['kind']}/{body['metadata']['name']}: image {image} is not in the "
                                       "engine (no registry to pull from: build it first)")
                self._images_ok.add(image)

    def _register(self, w: Workload, pod: Pod) -> None:
        """Adds a new pod to the store (a deleted pod of the same name moves to ``<name>@<uid8>``)."""
        with self.store.lock:
            old = self.store.pods.get(pod.name)
            if old is not None and old is not pod:
                if not old.deleted:
                    raise HarnessError(f"{pod.name}: a pod of that name still exists")
                self.store.pods[f"{old.name}@{old.uid[:8]}"] = old
            self.store.pods[pod.name] = pod
            w.pods.append(pod)

    def _spawn(self, pod: Pod) -> None:
        self.c.kubelet.hosts = dns.hosts(self.store, quiet=True)
        self.c.kubelet.spawn(pod, None)

    def _new_pod(self, w: Workload, slot: int) -> Pod:
        pod = self.c.controllers.make_pods(w, only_slot=slot)[0]
        self._register(w, pod)
        self._spawn(pod)
        return pod

    def _live(self, w: Workload) -> list[Pod]:
        return [p for p in w.pods if not p.deleted and not p.terminating]

    def _wait(self, what: str, predicate, deadline: float) -> None:
        self.c.wait_for(what, predicate, timeout_s=max(1.0, deadline - time.monotonic()), every_s=TICK_S)

    def _delete(self, pods: list[Pod]) -> list[threading.Thread]:
        """Starts deleting ``pods`` the Kubernetes way (no replacement), one thread each;
        each is marked terminating before this returns."""
        threads = []
        for p in pods:
            # at once: the rollout loop must not pick it again (delete_pod keeps these values)
            p.ready_when_deleted, p.terminating_since = p.ready, time.monotonic()
            p.terminating = True
            t = threading.Thread(target=self._delete_one, args=(p,), daemon=True, name=f"apply-delete-{p.name}")
            t.start()
            threads.append(t)
        return threads

    def _delete_one(self, p: Pod) -> None:
        try:
            term = self.c.terminator.delete_pod(self._key(p), replace=False, reason="apply")
            if self.report is not None:
                self.report.terminations.append(term)
        except Exception as exc:  # noqa: BLE001 - recorded: the test reads Cluster.errors
            self.store.error(f"{p.name}: deletion failed: {type(exc).__name__}: {exc}")

    def _key(self, p: Pod) -> str:
        with self.store.lock:
            for k, v in self.store.pods.items():
                if v is p:
                    return k
        raise HarnessError(f"{p.name}: not in the store")

    def _join(self, threads: list[threading.Thread], deadline: float) -> None:
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
            if t.is_alive():
                raise HarnessError(f"{t.name}: the pod deletion did not end before the step's deadline")

    # ------------------------------------------------------------------ workloads
    def _create(self, body: dict, deadline: float) -> str:
        self._check_images(body)
        name = body["metadata"]["name"]
        w = Workload(body["kind"], name, body)
        self.store.workloads[name] = w
        if w.kind == "Job":
            with self.store.lock:  # the replaced job's pods move aside: the new ones take their names
                for k, p in list(self.store.pods.items()):
                    if p.owner.name == name and p.deleted and "@" not in k:
                        self.store.pods[f"{k}@{p.uid[:8]}"] = self.store.pods.pop(k)
            self.c.controllers.plan(w)
            self.c.kubelet.hosts = dns.hosts(self.store, quiet=True)
            self.c.controllers.start(w)
            return f"{len(w.pods)} pods started (a custom resource: no await)"
        if w.kind == "StatefulSet":
            return self._statefulset(w, body, deadline)
        return self._deployment(w, body, deadline)

    def _delete_workload(self, name: str) -> str:
        w = self.store.workloads.get(name)
        if w is None:
            return "absent"
        pods = [p for p in w.pods if not p.deleted and (p.phase in ("Pending", "Running") or
                                                         any(c.running for c in p.containers))]
        self._join(self._delete(pods), time.monotonic() + max([p.grace_s for p in pods] + [0]) + 60)
        del self.store.workloads[name]
        return f"{len(pods)} pod(s) deleted"

    def _sts_slot(self, w: Workload, ordinal: int) -> int:
        """The address of StatefulSet pod ``<name>-<ordinal>``: the one it had before (its
        DNS name keeps resolving in containers that started earlier), else a new one."""
        name = f"{w.name}-{ordinal}"
        with self.store.lock:
            for p in self.store.pods.values():
                if p.name == name and p.owner.kind == "StatefulSet":
                    return p.slot
        return self.store.alloc_slot()

    def _statefulset(self, w: Workload, body: dict, deadline: float) -> str:
        self._check_images(body)
        spec = body["spec"]
        w.body = body
        n_old, n_new = len(w.slots), int(spec.get("replicas", 1))
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        strategy = spec.get("updateStrategy") or {}
        rev = template_hash(w)
        done: list[str] = []

        def pod_at(i: int) -> Optional[Pod]:
            return next((p for p in self._live(w) if p.index == i), None)

        created = []
        for i in range(n_old, n_new):
            w.slots.append(self._sts_slot(w, i))
            created.append(self._new_pod(w, w.slots[i]))
            if ordered:
                self._wait(f"{created[-1].name} ready", lambda p=created[-1]: p.ready, deadline)
        if created:
            done.append(f"created {[p.name for p in created]}")
        removed = []
        threads: list[threading.Thread] = []
        for i in reversed(range(n_new, n_old)):
            p = pod_at(i)
            w.slots.pop()
            if p is not None:
                removed.append(p.name)
                threads += self._delete([p])
                if ordered:
                    self._join(threads, deadline)
        self._join(threads, deadline)
        if removed:
            done.append(f"deleted {removed}")
        rolled = []
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            partition = int((strategy.get("rollingUpdate") or {}).get("partition", 0))
            for i in reversed(range(partition, n_new)):
                p = pod_at(i)
                if p is None or p.revision == rev:
                    continue
                self._join(self._delete([p]), deadline)
                new = self._new_pod(w, w.slots[i])
                rolled.append(new.name)
                self._wait(f"{new.name} ready", lambda p=new: p.ready, deadline)
        elif strategy.get("type") != "OnDelete":
            raise UnsupportedField(f"StatefulSet/{w.name}.spec.updateStrategy.type={strategy.get('type')!r}")
        if rolled:
            done.append(f"rolled {rolled}")

        def ready() -> bool:
            live = self._live(w)
            return len(live) == n_new and all(p.ready for p in live) and (
                strategy.get("type") == "OnDelete" or all(p.revision == rev for p in live))
        self._wait(f"StatefulSet/{w.name} ready ({n_new} replicas at revision {rev})", ready, deadline)
        return "; ".join(done) or "no pod changed"

    def _deployment(self, w: Workload, body: dict, deadline: float) -> str:
        self._check_images(body)
        spec = body["spec"]
        w.body = body
        replicas = int(spec.get("replicas", 1))
        rev = template_hash(w)
        strategy = spec.get("strategy") or {}
        kind = strategy.get("type", "RollingUpdate")
        created: list[str] = []
        removed: list[str] = []
        threads: list[threading.Thread] = []

        def create(slot: Optional[int] = None) -> None:
            slot = self.store.alloc_slot() if slot is None else slot
            w.slots.append(slot)
            created.append(self._new_pod(w, slot).name)

        def delete(pods: list[Pod]) -> None:
            for p in pods:
                if p.slot in w.slots:
                    w.slots.remove(p.slot)
                removed.append(p.name)
            threads.extend(self._delete(pods))

        old = [p for p in self._live(w) if p.revision != rev]
        if kind == "Recreate":
            slots = [p.slot for p in old]
            delete(old)
            self._join(threads, deadline)
            have = len([p for p in self._live(w) if p.revision == rev])
            for k in range(max(0, replicas - have)):
                create(slots[k] if k < len(slots) else None)
        elif kind == "RollingUpdate":
            ru = strategy.get("rollingUpdate") or {}
            surge = resolve_int_or_percent(ru.get("maxSurge"), replicas, round_up=True)
            unavailable = resolve_int_or_percent(ru.get("maxUnavailable"), replicas, round_up=False)
            if surge == 0 and unavailable == 0:
                unavailable = 1  # what the API server's validation leaves possible
            while True:
                live = self._live(w)
                new = [p for p in live if p.revision == rev]
                old = [p for p in live if p.revision != rev]
                if not old and len(new) == replicas and all(p.ready for p in new):
                    break
                if len(new) > replicas:  # a scale-down: not-ready, then the newest first
                    delete(sorted(new, key=lambda p: (p.ready, -p.created_at))[: len(new) - replicas])
                    continue
                for _ in range(max(0, min(replicas + surge - len(live), replicas - len(new)))):
                    create()
                live = self._live(w)
                ready = sum(p.ready for p in live)
                old_now = [p for p in live if p.revision != rev]
                unready_old = [p for p in old_now if not p.ready]
                spare = max(0, ready - (replicas - unavailable))
                ready_old = sorted((p for p in old_now if p.ready), key=lambda p: -p.created_at)
                victims = unready_old + ready_old[:spare]
                if victims:
                    delete(victims)
                if time.monotonic() > deadline:
                    raise HarnessError(f"Deployment/{w.name}: rollout not done by the deadline; pods: "
                                       + ", ".join(f"{p.name} {p.phase}{' ready' if p.ready else ''}"
                                                   for p in self._live(w)))
                if self.store.errors:
                    raise HarnessError(f"Deployment/{w.name} rollout: {len(self.store.errors)} error(s):\n"
                                       + "\n".join(self.store.errors))
                time.sleep(TICK_S)
        else:
            raise UnsupportedField(f"Deployment/{w.name}.spec.strategy.type={kind!r}")
        self._join(threads, deadline)

        def available() -> bool:
            live = self._live(w)
            return len(live) == replicas and all(p.ready and p.revision == rev for p in live)
        self._wait(f"Deployment/{w.name} available ({replicas} pods at revision {rev})", available, deadline)
        parts = [f"{kind}"] + ([f"created {created}"] if created else []) + ([f"deleted {removed}"] if removed else [])
        return "; ".join(parts)
