"""What the API server would hold for one run (namespace, Secrets, ConfigMaps, claims,
Services, workloads, pods, pod addresses) and the run's record (events log, errors,
rewrites, ignored fields, terminations), shared by every part of the harness."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Optional

from tests.containers.kube.errors import HarnessError
from tests.containers.kube.objects import ContainerRun, Pod, Workload
from tests.containers.kube.records import Rewrite, Termination

log = logging.getLogger("tests.containers.kube")

#: label every container of a run carries (value: the run id), for the events filter and the sweep
LABEL = "elastic-ctr-harness"
CLUSTER_DOMAIN = "cluster.local"


class Store:
    """The run's objects and record.

    Args:
        workdir: where host directories, volumes and logs go; the log is ``harness.log``.
        run_id: names the run's containers and labels them.
        ip_prefix / first_ip: pod addresses are ``<ip_prefix><first_ip + slot>``.
    """

    def __init__(self, workdir: Path, run_id: str, ip_prefix: str, first_ip: int):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.ip_prefix, self.first_ip = ip_prefix, first_ip
        self.lock = threading.RLock()
        self.log_file = open(self.workdir / "harness.log", "a", buffering=1)
        #: set when the run is being cleaned up: controllers and waits stop
        self.stopping = threading.Event()
        self.namespace = "default"
        self.secrets: dict[str, dict[str, str]] = {}
        self.configmaps: dict[str, dict[str, str]] = {}
        self.claims: dict[str, Path] = {}
        self.services: dict[str, dict] = {}
        self.workloads: dict[str, Workload] = {}
        #: pod name -> pod; a deleted StatefulSet pod replaced under its name stays as ``<name>@<uid8>``
        self.pods: dict[str, Pod] = {}
        self.rewrites: list[Rewrite] = []
        self.errors: list[str] = []
        self.events: list[str] = []
        self.ignored: list[tuple[str, str]] = []
        self.terminations: list[Termination] = []
        self.all_containers: list[ContainerRun] = []
        self._next_slot = 0
        #: seconds added to every liveness probe's initialDelaySeconds (``Cluster``)
        self.liveness_delay_s = 0.0

    def log(self, msg: str) -> None:
        """Appends a timestamped line to the events and ``harness.log``."""
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        with self.lock:
            self.events.append(line)
            self.log_file.write(line + "\n")
        log.info("%s", msg)

    def error(self, msg: str) -> None:
        """Records an error (a test asserts there is none) and logs it."""
        with self.lock:
            self.errors.append(msg)
        self.log("ERROR " + msg)

    def alloc_slot(self) -> int:
        """The next free address slot; HarnessError past ``.254``."""
        slot = self._next_slot
        self._next_slot += 1
        if self.first_ip + slot > 254:
            raise HarnessError("out of pod addresses")
        return slot

    def slot_ip(self, slot: int) -> str:
        """The address of ``slot``."""
        return f"{self.ip_prefix}{self.first_ip + slot}"

    def selected(self, selector: dict) -> list[Pod]:
        """The pods not deleted whose labels match ``selector`` (matchLabels)."""
        return [p for p in self.pods.values()
                if not p.deleted and all(p.labels.get(k) == v for k, v in selector.items())]

    def live_pods(self, owner: Optional[str] = None) -> list[Pod]:
        """The pods not deleted (of workload ``owner``, or all)."""
        return [p for k, p in self.pods.items() if "@" not in k and not p.deleted
                and (owner is None or p.owner.name == owner)]
