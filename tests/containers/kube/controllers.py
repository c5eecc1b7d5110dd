"""The workload controllers: Deployment and StatefulSet ``replicas`` pods (StatefulSet
``podManagementPolicy: OrderedReady`` starts ordinal by ordinal, each once the previous one
is ready; ``Parallel`` all at once), a deleted pod's replacement (Deployment: new name,
same address slot; StatefulSet: same name, same claims, fresh emptyDirs), and Volcano Jobs
(``tests.containers.kube.volcano``)."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Callable, Optional

from tests.containers.kube import volcano
from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import Pod, Workload, rand_name
from tests.containers.kube.records import Termination
from tests.containers.kube.store import Store


def template_hash(w: Workload) -> str:
    """The revision of ``w``'s pod template: 9 hex characters of its SHA-256 (what a
    Deployment's pod-template-hash and a StatefulSet's revision name play); "" for a Job."""
    tpl = w.body["spec"].get("template")
    return hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:9] if tpl else ""


class Controllers:
    """Creates and replaces the pods of the store's workloads.

    Args:
        spawn: ``spawn(pod, gang)`` hands a created pod to the kubelet (``gang``: the
            Volcano Job's start barrier, or None).
        delete: ``delete(name, replace=..., reason=...)`` deletes a pod the Kubernetes way
            (the Volcano job controller's CompleteJob).
    """

    def __init__(self, store: Store, spawn: Callable[[Pod, Optional[threading.Barrier]], None],
                 delete: Callable[..., Termination]):
        self.store, self.spawn, self.delete = store, spawn, delete

    def plan(self, w: Workload) -> None:
        """Checks ``w``, takes its address slots and creates (not starts) its pods."""
        spec = w.body["spec"]
        if w.kind in ("Deployment", "StatefulSet"):
            self._template_labels(w, spec["template"], f"{w.kind}/{w.name}")
            if w.kind == "StatefulSet":
                policy = spec.get("podManagementPolicy", "OrderedReady")
                if policy not in ("OrderedReady", "Parallel"):
                    raise UnsupportedField(f"StatefulSet/{w.name}.spec.podManagementPolicy={policy!r}")
            for _ in range(int(spec.get("replicas", 1))):
                w.slots.append(self.store.alloc_slot())
        else:
            volcano.plan_job(self.store, w)
        for p in self.make_pods(w):
            self.store.pods[p.name] = p
            w.pods.append(p)

    @staticmethod
    def _template_labels(w: Workload, template: dict, path: str) -> dict:
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        sel = ((w.body["spec"].get("selector") or {}).get("matchLabels")) or {}
        if any(labels.get(k) != v for k, v in sel.items()):
            raise HarnessError(f"{path}: selector {sel} does not match the template labels {labels}")
        return labels

    def make_pods(self, w: Workload, only_slot: Optional[int] = None) -> list[Pod]:
        """The pods of ``w`` (all, or the one of ``only_slot``: a replacement)."""
        store, spec = self.store, w.body["spec"]
        out = []
        h = template_hash(w)
        if w.kind == "Deployment":
            tpl = spec["template"]
            for slot in w.slots:
                if only_slot is not None and slot != only_slot:
                    continue
                name = f"{w.name}-{h}-{rand_name(5)}"
                out.append(Pod(store, name, w, slot, json.loads(json.dumps(tpl["spec"])),
                               dict(tpl["metadata"].get("labels") or {}), hostname=name, subdomain=None))
                out[-1].revision = h
        elif w.kind == "StatefulSet":
            tpl = spec["template"]
            for i, slot in enumerate(w.slots):
                if only_slot is not None and slot != only_slot:
                    continue
                name = f"{w.name}-{i}"
                pod_spec = json.loads(json.dumps(tpl["spec"]))
                for vct in spec.get("volumeClaimTemplates") or []:
                    claim = f"{vct['metadata']['name']}-{name}"
                    store.claims.setdefault(claim, store.workdir / "claims" / claim)
                    pod_spec.setdefault("volumes", []).append(
                        {"name": vct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
                out.append(Pod(store, name, w, slot, pod_spec, dict(tpl["metadata"].get("labels") or {}),
                               hostname=name, subdomain=spec["serviceName"], index=i))
                out[-1].revision = h
        else:
            out = volcano.job_pods(store, w, only_slot)
        return out

    def start(self, w: Workload) -> None:
        """Starts ``w``'s pods: a Volcano Job's at one barrier (and its job controller), an
        OrderedReady StatefulSet's one by one, others all at once."""
        if w.kind == "Job":
            gang = threading.Barrier(len(w.pods))
            w.phase = "Running"
            for p in w.pods:
                self.spawn(p, gang)
            threading.Thread(target=volcano.run_job_controller, args=(self.store, w, self.delete),
                             daemon=True, name=f"job-{w.name}").start()
        elif w.kind == "StatefulSet" and w.body["spec"].get("podManagementPolicy", "OrderedReady") == "OrderedReady":
            def ordered() -> None:
                for p in w.pods:
                    self.spawn(p, None)
                    while not p.ready and not self.store.stopping.is_set() and p.phase != "Failed":
                        time.sleep(0.2)
            threading.Thread(target=ordered, daemon=True).start()
        else:
            for p in w.pods:
                self.spawn(p, None)

    def replace(self, old: Pod) -> Pod:
        """Creates and starts the replacement of the deleted pod ``old`` (its slot)."""
        w = old.owner
        new = self.make_pods(w, only_slot=old.slot)[0]
        with self.store.lock:
            w.pods.append(new)
            if old.name == new.name:
                self.store.pods[f"{old.name}@{old.uid[:8]}"] = old  # keep the deleted one under another key
            self.store.pods[new.name] = new
        self.store.log(f"{w.kind}/{w.name}: replacing {old.name} with {new.name}")
        self.spawn(new, None)
        return new
