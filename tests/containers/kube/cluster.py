"""``Cluster``: a rendered stack run as containers, the entry point the tests use. It wires
the parts (store, engine, kubelet, probes, controllers, termination) and answers queries;
each part lives in its own module (see the package docstring)."""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from tests.containers.kube import dns, volumes
from tests.containers.kube import manifests as kmanifests
from tests.containers.kube.apply import ApplyReport, Applier
from tests.containers.kube.controllers import Controllers
from tests.containers.kube.diff import dependency_order
from tests.containers.kube.engine import Docker
from tests.containers.kube.errors import HarnessError
from tests.containers.kube.kubelet import Kubelet
from tests.containers.kube.objects import Pod, rand_name
from tests.containers.kube.probes import Prober
from tests.containers.kube.records import Termination
from tests.containers.kube.store import Store
from tests.containers.kube.termination import Terminator


def _from_store(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.store, name), doc=doc)


class Cluster:
    """A rendered stack run as containers. Use as a context manager (``cleanup`` at exit).

    Args:
        manifests: manifest bodies (dicts), an ``infra.render.Rendering``, or a directory of
            rendered ``NN-*.yaml`` files. Every field is checked (``schema.validate``) and
            every pod created (not started) here: UnsupportedField / HarnessError at once.
        workdir: where host directories, volumes and logs go (a pytest ``tmp_path``).
        docker_env: the environment the ``docker`` client runs with (``DOCKER_HOST``).
        secret_values: ``{(secret, key): value}`` for values the rendering redacted; others
            get a random value (consistent for every pod of the run).
        ip_prefix / first_ip: pod addresses ``<prefix><first_ip + slot>``.
        image_map: rendered image -> image run instead (to try a fix before it is in the
            tree; logged loudly).
        liveness_delay_s: added to every liveness probe's ``initialDelaySeconds`` (logged
            loudly): on a machine so loaded that a role needs longer than its rendered
            liveness window to start, the kubelet would restart it, which is not played.
    """

    workdir = _from_store("workdir", "the run's work directory")
    run_id = _from_store("run_id", "names and labels the run's containers")
    namespace = _from_store("namespace", "the rendering's namespace")
    secrets = _from_store("secrets", "Secret name -> {key: value} (redacted values replaced)")
    configmaps = _from_store("configmaps", "ConfigMap name -> {key: value}")
    claims = _from_store("claims", "claim name -> host directory")
    services = _from_store("services", "Service name -> manifest")
    workloads = _from_store("workloads", "workload name -> Workload")
    pods = _from_store("pods", "pod name -> Pod (a replaced StatefulSet pod stays as <name>@<uid8>)")
    rewrites = _from_store("rewrites", "every occurrence of the one rewrite (records.Rewrite)")
    errors = _from_store("errors", "what the kubelet would have restarted, failed pods, probe errors")
    events = _from_store("events", "the harness log's lines")
    ignored = _from_store("ignored", "(path, reason) of every rendered field knowingly not played")
    terminations = _from_store("terminations", "every pod deletion and kill (records.Termination)")
    all_containers = _from_store("all_containers", "every container started (objects.ContainerRun)")

    def __init__(self, manifests: Any, workdir: Path, docker_env: dict[str, str], *,
                 run_id: Optional[str] = None, secret_values: Optional[dict] = None,
                 ip_prefix: str = "127.0.0.", first_ip: int = 101, echo: Optional[Callable[[str], None]] = None,
                 image_map: Optional[dict[str, str]] = None, liveness_delay_s: float = 0.0):
        self.store = Store(workdir, run_id or rand_name(6), ip_prefix, first_ip)
        if liveness_delay_s:
            self.store.liveness_delay_s = float(liveness_delay_s)
            self.store.log(f"WARNING: every liveness probe starts {liveness_delay_s:.0f} s later than rendered "
                           "(liveness_delay_s: a machine too loaded for the rendered startup time)")
        self.echo = echo
        self.image_map = dict(image_map or {})
        #: the ``docker`` client of this run (callable: ``cluster.docker("logs", id)``)
        self.docker = Docker(docker_env, self.store.run_id)
        self.prober = Prober(self.store, self.docker)
        self.kubelet = Kubelet(self.store, self.docker, self.prober, self.image_map)
        self.controllers = Controllers(self.store, self.kubelet.spawn, self.delete_pod)
        self.terminator = Terminator(self.store, self.docker, self.kubelet, self.prober, self.controllers.replace)
        docs = kmanifests.bodies(manifests)
        kmanifests.load(self.store, docs, secret_values)
        #: the rendering the cluster runs: ``(file name, body)`` in dependency order (``apply``)
        self.applied = dependency_order(docs, kmanifests.dependencies(manifests))
        self.applier = Applier(self)
        #: set by ``start``
        self.started = False
        self._started_workloads: set[str] = set()
        for w in self.store.workloads.values():
            self.controllers.plan(w)

    # ------------------------------------------------------------------ lifecycle
    def start(self, only: Optional[Sequence[str]] = None) -> "Cluster":
        """Checks every image is in the engine and no pod address is in use, then starts
        every workload (all at once, as the API server would accept them; Volcano gangs at
        one barrier). ``only``: start just the workloads of these names now (what a cluster
        has before the stack is deployed, e.g. an object store), the rest at a later call."""
        if not self.started:
            for w in self.store.workloads.values():
                for c in (p for pod in w.pods for p in pod.spec.get("initContainers", []) + pod.spec["containers"]):
                    image = self.image_map.get(c["image"], c["image"])
                    if self.docker("image", "inspect", "--format", "{{.Id}}", image, check=False).returncode != 0:
                        raise HarnessError(f"{w.kind}/{w.name}: image {image} is not in the engine (no registry "
                                           "to pull from: build it first)")
            self._check_addresses_free()
            self.kubelet.hosts = dns.hosts(self.store)
            self.docker.watch_exits(self.kubelet.on_exit)
        for w in self.store.workloads.values():
            if w.name in self._started_workloads or (only is not None and w.name not in only):
                continue
            self.controllers.start(w)
            self._started_workloads.add(w.name)
        self.started = True
        return self

    def _check_addresses_free(self) -> None:
        """Refuses to start if something already listens on a pod address's ports."""
        busy = []
        for p in self.store.pods.values():
            for c in p.spec["containers"]:
                for port in c.get("ports") or []:
                    with socket.socket() as s:
                        s.settimeout(0.2)
                        if s.connect_ex((p.ip, int(port["containerPort"]))) == 0:
                            busy.append(f"{p.ip}:{port['containerPort']}")
        if busy:
            raise HarnessError(f"addresses in use before the start (another run?): {busy}")

    def apply(self, manifests: Any, *, secret_values: Optional[dict] = None, timeout_s: float = 600.0
              ) -> ApplyReport:
        """Applies a new rendering to the running one as ``pulumi up`` would (``apply``'s
        docstring says what is played and what is not): the steps of ``diff.diff`` in
        dependency order, each awaited like pulumi-kubernetes awaits it, deletes last.

        Args:
            manifests: the new rendering (as for the constructor).
            secret_values: for redacted Secret values the run does not hold yet.
            timeout_s: the await of each step, s (pulumi's default is 600).

        Returns the ``ApplyReport`` (steps, seconds, pod terminations). Raises
        UnsupportedField (a field the harness cannot play, checked before any step) or
        HarnessError (an await that timed out or saw a pod fail; the steps before it stay
        applied, as with ``pulumi up``)."""
        if not self.started:
            raise HarnessError("apply: the cluster is not started (call start() first)")
        return self.applier.apply(manifests, secret_values=secret_values, timeout_s=timeout_s)

    def delete_pod(self, name: str, *, replace: bool = True, grace_s: Optional[float] = None,
                   watch_readiness_s: Optional[float] = None, reason: str = "delete") -> Termination:
        """Deletes a pod the Kubernetes way (``termination.Terminator.delete_pod``)."""
        return self.terminator.delete_pod(name, replace=replace, grace_s=grace_s,
                                          watch_readiness_s=watch_readiness_s, reason=reason)

    def kill_pod(self, name: str, *, replace: bool = True) -> Termination:
        """Crashes a pod (``termination.Terminator.kill_pod``)."""
        return self.terminator.kill_pod(name, replace=replace)

    def shutdown(self, *, watch_readiness_s: Optional[float] = None) -> list[Termination]:
        """Deletes every running pod the Kubernetes way, all at once (no replacements)."""
        return self.terminator.shutdown(watch_readiness_s=watch_readiness_s)

    def cleanup(self) -> None:
        """Removes every container this run created (by id, then a sweep by this run's
        label) after saving its log, and ends the events watcher."""
        self.store.stopping.set()
        for p in list(self.store.pods.values()):
            p.stop_probing.set()
        for c in list(self.store.all_containers):
            if c.id is None:
                continue
            if not c.log_path.exists() or c.running:
                self.docker.save_log(c)
            self.docker("rm", "-f", c.id, check=False, timeout=60)
        self.docker.sweep()
        self.docker.stop_watching()
        self.store.log_file.close()

    def teardown(self) -> None:
        """The end of a run: pods still running are deleted the Kubernetes way (``shutdown``),
        then every container is removed (``cleanup``), also when the shutdown fails."""
        try:
            if any(c.running for c in self.store.all_containers):
                self.shutdown()
        finally:
            self.cleanup()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # ------------------------------------------------------------------ queries
    def live_pods(self, owner: Optional[str] = None) -> list[Pod]:
        """The pods not deleted (of workload ``owner``, or all)."""
        return self.store.live_pods(owner)

    def ip(self, pod: str) -> str:
        """The pod's address."""
        return self.store.pods[pod].ip

    def ready(self, pod: str) -> bool:
        """Whether the pod is ready (every container, not terminating)."""
        return self.store.pods[pod].ready

    def endpoints(self, service: str, propagation_s: float = 0.0) -> list[Pod]:
        """The Service's endpoints as a node's proxy sees them (``dns.endpoints``)."""
        return dns.endpoints(self.store, service, propagation_s)

    def logs(self, pod: str, container: Optional[str] = None) -> str:
        """The container's output so far (stdout and stderr); the pod's first container by default."""
        p = self.store.pods[pod]
        return self.docker.logs(p.container(container) if container else p.containers[0])

    def volume_dir(self, pod: str, volume: str) -> Path:
        """The host directory of a pod's volume (its claim's, for a claim)."""
        return volumes.volume_dir(self.store, self.store.pods[pod], volume)

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float, every_s: float = 0.5,
                 fail_on_errors: bool = True) -> Any:
        """Polls ``predicate`` every ``every_s`` s until truthy (returned); raises
        ``HarnessError`` after ``timeout_s`` s or at once when a pod failed (``errors``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if fail_on_errors and self.store.errors:
                raise HarnessError(f"waiting for {what}: {len(self.store.errors)} error(s):\n"
                                   + "\n".join(self.store.errors))
            if time.monotonic() > deadline:
                raise HarnessError(f"{what}: not after {timeout_s:.0f} s; pods: "
                                   + ", ".join(f"{p.name} {p.phase}{' ready' if p.ready else ''}"
                                               for p in self.live_pods()))
            time.sleep(every_s)

    def wait_ready(self, names: Iterable[str], timeout_s: float) -> None:
        """Waits until every named pod is ready (``timeout_s`` s)."""
        names = list(names)
        self.wait_for(f"pods ready {names}", lambda: all(self.store.pods[n].ready for n in names), timeout_s)

    def status(self) -> str:
        """One line per live pod: name, address, phase, each container's state."""
        rows = []
        for p in sorted(self.live_pods(), key=lambda p: p.slot):
            cs = ", ".join(f"{c.name}:{'ready' if c.ready else ('exit ' + str(c.exit_code) if c.exited.is_set() else 'not-ready')}"
                           for c in p.containers)
            rows.append(f"{p.name:42s} {p.ip:15s} {p.phase:10s} {cs}")
        return "\n".join(rows)
