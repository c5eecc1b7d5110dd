"""Running pods as the kubelet would, one Docker container per (init) container.

A pod's init containers run one after the other to completion (exit 0) before its
containers start; containers start together (hostname = the pod's). No container is ever
restarted: an exit of a ``restartPolicy: Always`` container is recorded in
``Store.errors`` (the kubelet would restart it; a test asserts there is none) instead of
being hidden by a restart. Exits come from the engine's ``die`` events (``docker inspect``
as a fallback).
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from tests.containers.kube import volumes
from tests.containers.kube.containerspec import docker_run_args
from tests.containers.kube.engine import Docker, tail
from tests.containers.kube.objects import ContainerRun, Pod
from tests.containers.kube.probes import Prober
from tests.containers.kube.store import Store


class Kubelet:
    """Starts pods and tracks their containers' exits.

    ``hosts`` (the cluster DNS table, ``dns.hosts``) must be set before the first pod
    starts; ``image_map``: rendered image -> image run instead."""

    def __init__(self, store: Store, docker: Docker, prober: Prober, image_map: dict[str, str]):
        self.store, self.docker, self.prober, self.image_map = store, docker, prober, image_map
        self.hosts: dict[str, str] = {}
        self._exits: dict[str, tuple[int, float]] = {}
        self._by_id: dict[str, ContainerRun] = {}

    def spawn(self, pod: Pod, gang: Optional[threading.Barrier] = None) -> None:
        """Starts ``pod`` in its own thread (after ``gang``'s barrier, for a Volcano Job)."""
        self.store.log(f"{pod.name}: created ({pod.owner.kind}/{pod.owner.name}, {pod.ip})")
        pod.thread = threading.Thread(target=self._run_pod, args=(pod, gang), daemon=True, name=f"pod-{pod.name}")
        pod.thread.start()

    def _run_pod(self, pod: Pod, gang: Optional[threading.Barrier] = None) -> None:
        store = self.store
        try:
            pod.dir.mkdir(parents=True, exist_ok=True)
            vols = volumes.pod_volumes(store, pod)
            if gang is not None:
                gang.wait(timeout=600)
            for cr in pod.init_containers:
                if pod.terminating:
                    return
                self._start_container(pod, cr, vols)
                self.wait_exit(cr, timeout=None)
                if cr.exit_code != 0:
                    pod.phase = "Failed"
                    pod.error = f"init container {cr.name} exited {cr.exit_code}"
                    store.error(f"{pod.name}: {pod.error}; log tail:\n{tail(cr.log_path)}")
                    return
            if pod.terminating:
                return
            for cr in pod.containers:
                self._start_container(pod, cr, vols)
            pod.phase = "Running"
            for cr in pod.containers:
                hook = ((cr.spec.get("lifecycle") or {}).get("postStart"))
                if hook:
                    self.prober.run_handler(pod, cr, hook, 60, "postStart")
                self.prober.start(pod, cr)
        except Exception as exc:  # noqa: BLE001 - recorded: the test reads Cluster.errors
            pod.phase = "Failed"
            pod.error = f"{type(exc).__name__}: {exc}"
            store.error(f"{pod.name}: could not start: {pod.error}")

    def _start_container(self, pod: Pod, cr: ContainerRun, vols: dict) -> None:
        args, client_env = docker_run_args(self.store, self.docker, pod, cr, vols, self.hosts, self.image_map)
        proc = self.docker(*args, env=client_env, timeout=120)
        cid = proc.stdout.strip().splitlines()[-1]
        with self.store.lock:
            cr.id, cr.started_at = cid, time.monotonic()
            self._by_id[cid] = cr
            self.store.all_containers.append(cr)
            early = self._exits.get(cid)
        self.store.log(f"{pod.name}/{cr.name}: started {cr.docker_name} ({cid[:12]}) on {pod.ip}")
        if early:
            self.on_exit(cid, early[0])

    def wait_exit(self, cr: ContainerRun, timeout: Optional[float]) -> bool:
        """Waits (``timeout`` s, None = no limit) until ``cr`` exited; returns whether it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cr.exited.is_set():
            if self.store.stopping.is_set() and cr.id is None:
                return False
            step = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
            if cr.exited.wait(step):
                break
            if cr.id is not None and not cr.exited.is_set():
                code = self.docker.exit_state(cr)
                if code is not None:
                    self.on_exit(cr.id, code)
            if deadline is not None and time.monotonic() >= deadline:
                return cr.exited.is_set()
        return True

    def on_exit(self, cid: str, code: int) -> None:
        """A container of the run exited with ``code`` (an engine ``die`` event)."""
        with self.store.lock:
            now = time.monotonic()
            self._exits[cid] = (code, now)
            c = self._by_id.get(cid)
        if c is not None and not c.exited.is_set():
            c.exit_code, c.exited_at = code, now
            c.set_ready(False)
            c.exited.set()
            self.store.log(f"{c.pod.name}/{c.name}: exited {code}")
            self.docker.save_log(c)
            self._on_container_exit(c)

    def _on_container_exit(self, cr: ContainerRun) -> None:
        pod, store = cr.pod, self.store
        if cr.init or pod.terminating or store.stopping.is_set():
            return
        policy = pod.spec.get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and cr.exit_code != 0):
            store.error(f"{pod.name}/{cr.name} exited {cr.exit_code} on its own (restartPolicy {policy}: the kubelet "
                        f"would restart it; not played); log tail:\n{tail(cr.log_path)}")
        if all(c.exited.is_set() for c in pod.containers):
            pod.phase = "Succeeded" if all(c.exit_code == 0 for c in pod.containers) else "Failed"
            store.log(f"{pod.name}: {pod.phase}")
            if pod.phase == "Failed":
                store.error(f"{pod.name}: Failed ({', '.join(f'{c.name} exit {c.exit_code}' for c in pod.containers)}); "
                            f"log tail:\n{tail(pod.containers[0].log_path)}")
