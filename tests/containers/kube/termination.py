"""Deleting pods the Kubernetes way, and crashing them.

Deletion: the pod is marked terminating (it leaves every Service's endpoints at once),
preStop hooks run (exec, httpGet, sleep), then SIGTERM (``docker kill --signal TERM``) to
every container, and SIGKILL to whatever still runs ``terminationGracePeriodSeconds``
(default 30 s) after the deletion began. The kubelet then removes the pod's emptyDirs
(claims stay) and the owning Deployment/StatefulSet controller creates the replacement.
A kill is the crash variant: SIGKILL at once, no grace, no hook.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from tests.containers.kube import volumes
from tests.containers.kube.engine import Docker
from tests.containers.kube.kubelet import Kubelet
from tests.containers.kube.objects import ContainerRun, Pod
from tests.containers.kube.probes import Prober
from tests.containers.kube.records import ContainerExit, Termination
from tests.containers.kube.store import Store


class Terminator:
    """Deletes and kills the store's pods; ``replace(pod)`` is the owning controller's
    replacement (``controllers.Controllers.replace``)."""

    def __init__(self, store: Store, docker: Docker, kubelet: Kubelet, prober: Prober,
                 replace: Callable[[Pod], Pod]):
        self.store, self.docker, self.kubelet, self.prober = store, docker, kubelet, prober
        self.replace = replace

    def delete_pod(self, name: str, *, replace: bool = True, grace_s: Optional[float] = None,
                   watch_readiness_s: Optional[float] = None, reason: str = "delete") -> Termination:
        """Deletes pod ``name`` the Kubernetes way and waits until it is gone. ``grace_s``
        overrides the pod's grace period (s). ``watch_readiness_s``: also probe each
        container's readiness endpoint at this interval (s) during the termination,
        recording when it first fails. With ``replace`` the owning Deployment/StatefulSet
        creates its replacement (``Termination.replacement``)."""
        store = self.store
        pod = store.pods[name]
        grace = pod.grace_s if grace_s is None else grace_s
        term = Termination(name, reason, grace)
        t0 = time.monotonic()
        if not pod.terminating:  # (Cluster.apply marks the pods it deletes itself, a moment earlier)
            pod.ready_when_deleted = pod.ready
            pod.terminating_since = t0
        pod.terminating = True
        store.log(f"{name}: deleting ({reason}, grace {grace:.0f} s)")
        running = [c for c in pod.containers if c.running]
        first_fail: dict[str, float] = {}
        watchers = []
        if watch_readiness_s:
            for c in running:
                probe = c.spec.get("readinessProbe")
                if not probe:
                    continue

                def watch(c=c, probe=probe) -> None:
                    while c.running and c.name not in first_fail:
                        ok, _ = self.prober.probe_once(pod, c, probe, 1.0)
                        if not ok and c.running:
                            first_fail[c.name] = time.monotonic() - t0
                            return
                        time.sleep(watch_readiness_s)
                watchers.append(threading.Thread(target=watch, daemon=True))
        for t in watchers:
            t.start()

        def stop(c: ContainerRun) -> None:
            hook = (c.spec.get("lifecycle") or {}).get("preStop")
            if hook:
                self.prober.run_handler(pod, c, hook, grace - (time.monotonic() - t0), "preStop")
            if c.running:
                # the kubelet's SIGTERM; a failed call is retried once and logged (not lost silently)
                for attempt in (1, 2):
                    r = self.docker("kill", "--signal", "TERM", c.id, check=False, timeout=30)
                    if r.returncode == 0 or not c.running:
                        break
                    store.log(f"{name}/{c.name}: docker kill --signal TERM failed ({attempt}): "
                              f"{(r.stderr or r.stdout).strip()[-300:]}")
                    time.sleep(1.0)
                store.log(f"{name}/{c.name}: SIGTERM")

        threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=grace + 5)
        sigkilled = set()
        for c in running:
            left = grace - (time.monotonic() - t0)
            if not self.kubelet.wait_exit(c, timeout=max(0.0, left)):
                store.log(f"{name}/{c.name}: still running {grace:.0f} s after the deletion: SIGKILL")
                self.docker("kill", "--signal", "KILL", c.id, check=False)
                sigkilled.add(c.name)
                self.kubelet.wait_exit(c, timeout=30)
        for t in watchers:
            t.join(timeout=2)
        for c in pod.containers:
            if c not in running and c.id is None:
                continue
            kub = next((ts - t0 for ts, r in c.ready_history if not r and ts >= t0), None)
            term.containers.append(ContainerExit(
                c.name, c.exit_code, (c.exited_at - t0) if (c in running and c.exited_at) else None,
                c.name in sigkilled, first_fail.get(c.name), kub))
        self._finish(pod)
        store.log(f"terminated: {term.summary()}")
        return self._record(pod, term, replace)

    def kill_pod(self, name: str, *, replace: bool = True) -> Termination:
        """A crash: SIGKILL to every container of pod ``name`` at once (no grace, no hook),
        then the controller's replacement (StatefulSet: same name and claims, fresh
        emptyDirs)."""
        pod = self.store.pods[name]
        term = Termination(name, "kill", 0.0)
        t0 = time.monotonic()
        pod.ready_when_deleted = pod.ready
        pod.terminating_since = t0
        pod.terminating = True
        running = [c for c in pod.containers if c.running]
        for c in running:
            self.docker("kill", "--signal", "KILL", c.id, check=False)
        for c in running:
            self.kubelet.wait_exit(c, timeout=30)
            term.containers.append(ContainerExit(c.name, c.exit_code, (c.exited_at or t0) - t0, True))
        self._finish(pod)
        self.store.log(f"killed: {term.summary()}")
        return self._record(pod, term, replace)

    def _record(self, pod: Pod, term: Termination, replace: bool) -> Termination:
        with self.store.lock:
            self.store.terminations.append(term)
        if replace and pod.owner.kind in ("Deployment", "StatefulSet"):
            term.replacement = self.replace(pod).name
        return term

    def _finish(self, pod: Pod) -> None:
        pod.stop_probing.set()
        pod.deleted = True
        if pod.phase in ("Running", "Pending"):
            pod.phase = "Succeeded" if all(c.exit_code == 0 for c in pod.containers if c.id) else "Failed"
        for c in pod.init_containers + pod.containers:
            if c.id and c.exited.is_set() and not c.log_path.exists():
                self.docker.save_log(c)
        volumes.remove_empty_dirs(pod)

    def shutdown(self, *, watch_readiness_s: Optional[float] = None) -> list[Termination]:
        """Deletes every running pod the Kubernetes way, all at once (no replacements);
        returns the terminations by pod name."""
        live = [p for k, p in self.store.pods.items() if "@" not in k and not p.deleted and not p.terminating
                and any(c.running for c in p.containers)]
        out: list[Termination] = []
        threads = []
        lock = threading.Lock()

        def one(p: Pod) -> None:
            t = self.delete_pod(p.name, replace=False, reason="shutdown", watch_readiness_s=watch_readiness_s)
            with lock:
                out.append(t)
        for p in live:
            threads.append(threading.Thread(target=one, args=(p,), daemon=True))
            threads[-1].start()
        for t in threads:
            t.join(timeout=max(p.grace_s for p in live) + 60 if live else 1)
        return sorted(out, key=lambda t: t.pod)
