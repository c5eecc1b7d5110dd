"""Volcano's Job (``batch.volcano.sh/v1alpha1``) as its controller and plugins would run it.

Pods ``<job>-<task>-<i>`` of every task, started together at one barrier (gang start;
``minAvailable`` must be satisfiable by the tasks' replicas). ``svc`` plugin: hostname
``<pod>`` + subdomain ``<job>``, env ``VC_<TASK>_HOSTS`` (comma-separated ``<pod>.<job>``)
and ``VC_<TASK>_NUM`` for every task, and the ConfigMap ``<job>-svc`` mounted at
``/etc/volcano`` (files ``<task>.host``, newline-separated, plus the ``VC_*`` keys).
``env`` plugin: ``VC_TASK_INDEX`` and ``VK_TASK_INDEX``. Task policy ``TaskCompleted ->
CompleteJob``: once every pod of that task exited 0, every other running pod is deleted
the Kubernetes way and the job is ``Completed``; a failed pod makes the job ``Failed``.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Optional

from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import Pod, Workload
from tests.containers.kube.records import Termination
from tests.containers.kube.store import Store


def plan_job(store: Store, w: Workload) -> None:
    """Checks the Job's plugins, policies and ``minAvailable``, and takes one address slot
    per pod (task order)."""
    spec = w.body["spec"]
    for name, args in (spec.get("plugins") or {}).items():
        if args:
            raise UnsupportedField(f"Job/{w.name}.spec.plugins.{name}={args!r}", "plugin arguments")
    total = 0
    for t in spec["tasks"]:
        for j, p in enumerate(t.get("policies") or []):
            if (p.get("event"), p.get("action")) != ("TaskCompleted", "CompleteJob"):
                raise UnsupportedField(f"Job/{w.name}.spec.tasks[{t['name']}].policies[{j}]={p}",
                                       "only TaskCompleted -> CompleteJob is played")
        total += int(t.get("replicas", 1))
        for _ in range(int(t.get("replicas", 1))):
            w.slots.append(store.alloc_slot())
    if int(spec.get("minAvailable", total)) > total:
        raise HarnessError(f"Job/{w.name}: minAvailable {spec['minAvailable']} > {total} pods: "
                           "the gang would never be scheduled")


def job_pods(store: Store, w: Workload, only_slot: Optional[int] = None) -> list[Pod]:
    """The Job's pods (all, or the one of ``only_slot``), with the plugins' env, volume and
    mount; writes the ``svc`` plugin's ConfigMap ``<job>-svc`` into the store."""
    spec = w.body["spec"]
    plugins = spec.get("plugins") or {}
    tasks = spec["tasks"]
    hosts = {t["name"]: [f"{w.name}-{t['name']}-{i}.{w.name}" for i in range(int(t.get("replicas", 1)))]
             for t in tasks}
    svc_cm = f"{w.name}-svc"
    if "svc" in plugins:
        data = {}
        for t in tasks:
            key = t["name"].replace("-", "_")
            data[f"{key}.host"] = "\n".join(hosts[t["name"]])
            data[f"VC_{key.upper()}_HOSTS"] = ",".join(hosts[t["name"]])
            data[f"VC_{key.upper()}_NUM"] = str(len(hosts[t["name"]]))
        store.configmaps[svc_cm] = data
    out = []
    slots = iter(w.slots)
    for t in tasks:
        for i in range(int(t.get("replicas", 1))):
            slot = next(slots)
            if only_slot is not None and slot != only_slot:
                continue
            name = f"{w.name}-{t['name']}-{i}"
            env, vols, mounts = [], [], []
            if "svc" in plugins:
                for t2 in tasks:
                    key = t2["name"].replace("-", "_").upper()
                    for var in (f"VC_{key}_HOSTS", f"VC_{key}_NUM"):
                        env.append({"name": var, "valueFrom": {"configMapKeyRef": {"name": svc_cm, "key": var}}})
                vols.append({"name": svc_cm, "configMap": {"name": svc_cm}})
                mounts.append({"name": svc_cm, "mountPath": "/etc/volcano"})
            if "env" in plugins:
                env += [{"name": "VK_TASK_INDEX", "value": str(i)}, {"name": "VC_TASK_INDEX", "value": str(i)}]
            labels = {**(t["template"].get("metadata", {}).get("labels") or {}),
                      "volcano.sh/job-name": w.name, "volcano.sh/task-spec": t["name"]}
            out.append(Pod(store, name, w, slot, json.loads(json.dumps(t["template"]["spec"])), labels,
                           hostname=name, subdomain=w.name if "svc" in plugins else None,
                           extra_env=env, extra_volumes=vols, extra_mounts=mounts, index=i))
            out[-1].task = t["name"]
    return out


def run_job_controller(store: Store, w: Workload, delete: Callable[..., Termination]) -> None:
    """Watches the Job's pods (every 0.5 s) until it is ``Completed`` or ``Failed``; deletes
    the remaining pods through ``delete(name, replace=False, reason=...)``."""
    completing = {t["name"] for t in w.body["spec"]["tasks"]
                  if any(p.get("action") == "CompleteJob" for p in t.get("policies") or [])}
    while not store.stopping.is_set():
        pods = [p for p in w.pods if not p.deleted]
        if any(p.phase == "Failed" for p in pods):
            w.phase = "Failed"
            bad = [p.name for p in pods if p.phase == "Failed"]
            store.error(f"Job/{w.name}: Failed (pods {bad}; PodFailed -> RestartJob is not played)")
            for p in pods:
                if p.phase in ("Running", "Pending") and not p.terminating:
                    w.completion.append(delete(p.name, replace=False, reason="job failed"))
            return
        done_tasks = {t for t in completing
                      if all(p.phase == "Succeeded" for p in pods if getattr(p, "task", None) == t)}
        if done_tasks or all(p.phase == "Succeeded" for p in pods):
            why = f"TaskCompleted({','.join(sorted(done_tasks))}) -> CompleteJob" if done_tasks else "all succeeded"
            store.log(f"Job/{w.name}: {why}")
            w.phase = "Completing"
            for p in pods:
                if p.phase in ("Running", "Pending") and not p.terminating:
                    w.completion.append(delete(p.name, replace=False, reason="CompleteJob"))
            w.phase = "Completed"
            return
        time.sleep(0.5)
