"""The objects the harness plays: workloads, their pods, and each pod's containers with what
the kubelet tracks of them (Docker id, start/exit times from ``time.monotonic()``, exit
code, readiness)."""
from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

#: ``terminationGracePeriodSeconds`` when the pod spec sets none (Kubernetes' default), s
DEFAULT_GRACE_S = 30


def rand_name(n: int) -> str:
    """``n`` random characters of the alphabet Kubernetes uses for generated names."""
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


class ContainerRun:
    """One container of one pod: its Docker container and what the kubelet tracks.

    ``spec`` is the rendered container (a dict); ``init`` is true for an init container."""

    def __init__(self, pod: "Pod", spec: dict, init: bool):
        self.pod, self.spec, self.init = pod, spec, init
        self.name = spec["name"]
        self.docker_name = f"ectr-{pod.store.run_id}-{pod.name}-{self.name}-{pod.uid[:5]}"
        self.id: Optional[str] = None
        self.started_at: Optional[float] = None
        self.exited_at: Optional[float] = None
        self.exit_code: Optional[int] = None
        self.ready = False
        self.started_ok = False  # startupProbe passed (or none)
        self.ready_history: list[tuple[float, bool]] = []
        self.exited = threading.Event()
        self.log_path = pod.store.workdir / "logs" / pod.name / f"{self.name}-{pod.uid[:5]}.log"

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self.id is not None and not self.exited.is_set()

    def set_ready(self, value: bool) -> None:
        """Records a readiness transition (with its time) and logs it."""
        if value != self.ready:
            self.ready = value
            self.ready_history.append((time.monotonic(), value))
            self.pod.store.log(f"{self.pod.name}/{self.name}: ready={value}")


class Pod:
    """One pod: its spec (a copy of the template's), labels, address slot, phase
    (``Pending``, ``Running``, ``Succeeded``, ``Failed``) and containers.

    ``store`` is the run's :class:`tests.containers.kube.store.Store`; ``extra_env``,
    ``extra_volumes`` and ``extra_mounts`` are what Volcano's plugins add (manifest dicts);
    ``index`` is the StatefulSet ordinal or the Volcano task index."""

    def __init__(self, store: Any, name: str, owner: "Workload", slot: int, spec: dict, labels: dict,
                 hostname: str, subdomain: Optional[str], extra_env: Optional[list] = None,
                 extra_volumes: Optional[list] = None, extra_mounts: Optional[list] = None, index: int = 0):
        self.store, self.name, self.owner, self.slot = store, name, owner, slot
        self.spec, self.labels, self.hostname, self.subdomain = spec, labels, hostname, subdomain
        self.index = index
        #: the hash of the pod template it was made from (a Deployment's ReplicaSet, a
        #: StatefulSet's controller revision); a rollout replaces the pods of other revisions
        self.revision = ""
        self.task: Optional[str] = None  # Volcano task name
        self.uid = hashlib.sha1(f"{name}{time.time_ns()}{random.random()}".encode()).hexdigest()
        self.extra_env = extra_env or []
        self.extra_volumes = extra_volumes or []
        self.extra_mounts = extra_mounts or []
        self.dir = store.workdir / "pods" / f"{name}-{self.uid[:8]}"
        self.phase = "Pending"
        self.error: Optional[str] = None
        self.terminating = False
        self.terminating_since: Optional[float] = None
        self.ready_when_deleted = False
        self.deleted = False
        self.created_at = time.monotonic()
        self.init_containers = [ContainerRun(self, c, True) for c in spec.get("initContainers", [])]
        self.containers = [ContainerRun(self, c, False) for c in spec["containers"]]
        self.thread: Optional[threading.Thread] = None
        self.probers: list[threading.Thread] = []
        self.stop_probing = threading.Event()

    @property
    def ip(self) -> str:
        """The pod's address, ``127.0.0.x`` (its slot's)."""
        return self.store.slot_ip(self.slot)

    @property
    def ready(self) -> bool:
        """Running, not terminating, and every container ready."""
        return self.phase == "Running" and not self.terminating and all(c.ready for c in self.containers)

    @property
    def grace_s(self) -> float:
        """``terminationGracePeriodSeconds`` (default 30), s."""
        return float(self.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))

    def container(self, name: str) -> ContainerRun:
        """The (init) container ``name``; KeyError when absent."""
        for c in self.init_containers + self.containers:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: no container {name}")

    def __repr__(self) -> str:
        return f"Pod({self.name} {self.ip} {self.phase}{' terminating' if self.terminating else ''})"


@dataclass
class Workload:
    """A Deployment, StatefulSet or Volcano Job (``body`` is its manifest), its pods (deleted
    ones too) and the address slots its pods take (a replacement takes its predecessor's)."""

    kind: str  # Deployment | StatefulSet | Job
    name: str
    body: dict
    pods: list[Pod] = field(default_factory=list)
    phase: str = "Pending"  # Job: Pending, Running, Completing, Completed, Failed
    completion: list = field(default_factory=list)  # Job: CompleteJob's deletions (records.Termination)
    slots: list[int] = field(default_factory=list)
