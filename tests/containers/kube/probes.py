"""Probes and lifecycle hooks as the kubelet runs them, against the pod's address.

readinessProbe, livenessProbe, startupProbe with httpGet (HTTP 200-399 is success),
tcpSocket, grpc (``grpc.health.v1.Health/Check``) or exec; initialDelaySeconds,
periodSeconds, timeoutSeconds, successThreshold, failureThreshold (Kubernetes' defaults).
Pod readiness = every container ready. A liveness or startup probe failing
``failureThreshold`` times is recorded in ``Store.errors`` (the kubelet would restart the
container; not played). Hooks (preStop, postStart): exec, httpGet, sleep.
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import Any

from tests.containers.kube.engine import Docker
from tests.containers.kube.errors import HarnessError, UnsupportedField
from tests.containers.kube.objects import ContainerRun, Pod
from tests.containers.kube.store import Store


def container_port(c: dict, port: Any, where: str) -> int:
    """A probe's or hook's ``port`` (a number, or the name of one of ``c``'s ports)."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for p in c.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise HarnessError(f"{where}: no container port named {port!r}")


def grpc_probe(host: str, port: int, service: str, timeout: float) -> tuple[bool, str]:
    """gRPC health check of ``service`` ("" = the server) at ``host:port`` (timeout in s)."""
    try:
        import grpc
    except ImportError as exc:  # pragma: no cover - grpcio is a test dependency of serving
        raise UnsupportedField("probe.grpc", "grpcio is not installed on the host") from exc
    req = b"" if not service else b"\x0a" + bytes([len(service.encode())]) + service.encode()
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        call = ch.unary_unary("/grpc.health.v1.Health/Check")
        try:
            resp = call(req, timeout=timeout)
        except grpc.RpcError as exc:
            return False, str(exc.code())
    return resp == b"\x08\x01", f"status bytes {resp!r}"  # SERVING = 1


class Prober:
    """Runs the probes and hooks of the store's containers (``docker`` for exec)."""

    def __init__(self, store: Store, docker: Docker):
        self.store, self.docker = store, docker

    def probe_once(self, pod: Pod, cr: ContainerRun, probe: dict, timeout: float) -> tuple[bool, str]:
        """One probe run (``timeout`` in s): (success, what was seen)."""
        where = f"{pod.name}/{cr.name} probe"
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                if g.get("scheme", "HTTP") != "HTTP":
                    raise UnsupportedField(f"{where}.httpGet.scheme={g['scheme']!r}")
                host = g.get("host") or pod.ip
                conn = http.client.HTTPConnection(host, container_port(cr.spec, g["port"], where), timeout=timeout)
                try:
                    headers = {h["name"]: h["value"] for h in g.get("httpHeaders") or []}
                    headers.setdefault("User-Agent", "kube-probe/1.31")
                    conn.request("GET", g.get("path", "/"), headers=headers)
                    r = conn.getresponse()
                    r.read()
                    return 200 <= r.status < 400, f"HTTP {r.status}"
                finally:
                    conn.close()
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                with socket.create_connection((t.get("host") or pod.ip, container_port(cr.spec, t["port"], where)),
                                              timeout=timeout):
                    return True, "connected"
            if "grpc" in probe:
                return grpc_probe(pod.ip, int(probe["grpc"]["port"]), probe["grpc"].get("service", ""), timeout)
            if "exec" in probe:
                r = self.docker("exec", cr.id, *probe["exec"]["command"], check=False, timeout=timeout + 5)
                return r.returncode == 0, f"exit {r.returncode}"
        except (OSError, http.client.HTTPException) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        raise UnsupportedField(f"{where}", "no handler the harness knows (httpGet, tcpSocket, grpc, exec)")

    def start(self, pod: Pod, cr: ContainerRun) -> None:
        """Starts one thread per probe of the started container ``cr`` (a container without a
        readiness probe is ready once started and past its startup probe)."""
        spec = cr.spec
        startup = spec.get("startupProbe")
        if not startup:
            cr.started_ok = True
        if not spec.get("readinessProbe"):
            if cr.started_ok:
                cr.set_ready(True)
        kinds = [k for k in ("startupProbe", "readinessProbe", "livenessProbe") if spec.get(k)]
        for kind in kinds:
            t = threading.Thread(target=self._prober, args=(pod, cr, kind), daemon=True,
                                 name=f"probe-{pod.name}-{cr.name}-{kind}")
            pod.probers.append(t)
            t.start()

    def _prober(self, pod: Pod, cr: ContainerRun, kind: str) -> None:
        try:
            self._probe_loop(pod, cr, kind)
        except Exception as exc:  # noqa: BLE001 - recorded: the test reads Cluster.errors
            self.store.error(f"{pod.name}/{cr.name} {kind}: {type(exc).__name__}: {exc}")

    def _probe_loop(self, pod: Pod, cr: ContainerRun, kind: str) -> None:
        probe = cr.spec[kind]
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        fail_n = int(probe.get("failureThreshold", 3))
        ok_n = int(probe.get("successThreshold", 1))
        delay = float(probe.get("initialDelaySeconds", 0))
        if kind == "livenessProbe":
            delay += self.store.liveness_delay_s  # Cluster(liveness_delay_s=...): an overloaded machine
        if pod.stop_probing.wait(delay):
            return
        oks = fails = 0
        while cr.running and not pod.stop_probing.is_set():
            if kind != "startupProbe" and not cr.started_ok:
                if pod.stop_probing.wait(0.2):
                    return
                continue
            ok, why = self.probe_once(pod, cr, probe, timeout)
            if not cr.running:
                return
            oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
            if kind == "readinessProbe":
                if not cr.ready and oks >= ok_n:
                    cr.set_ready(True)
                elif cr.ready and fails >= fail_n:
                    self.store.log(f"{pod.name}/{cr.name}: readiness probe failed {fails}x ({why})")
                    cr.set_ready(False)
            elif kind == "livenessProbe":
                if fails >= fail_n and not pod.terminating:
                    self.store.error(f"{pod.name}/{cr.name}: liveness probe failed {fails}x ({why}): the kubelet "
                                     "would restart the container (not played)")
                    fails = 0
            else:  # startupProbe
                if ok:
                    cr.started_ok = True
                    if not cr.spec.get("readinessProbe"):
                        cr.set_ready(True)
                    return
                if fails >= fail_n:
                    self.store.error(f"{pod.name}/{cr.name}: startup probe failed {fails}x ({why}): the kubelet "
                                     "would restart the container (not played)")
                    return
            pod.stop_probing.wait(period)

    def run_handler(self, pod: Pod, cr: ContainerRun, hook: dict, budget_s: float, what: str) -> None:
        """Runs a lifecycle hook (``what``: ``preStop`` | ``postStart``) within ``budget_s`` s."""
        t0 = time.monotonic()
        log = self.store.log
        if "exec" in hook:
            r = self.docker("exec", cr.id, *hook["exec"]["command"], check=False, timeout=max(1.0, budget_s))
            log(f"{pod.name}/{cr.name}: {what} exec exited {r.returncode}")
        elif "httpGet" in hook:
            g = hook["httpGet"]
            try:
                conn = http.client.HTTPConnection(g.get("host") or pod.ip, container_port(cr.spec, g["port"], what),
                                                  timeout=max(1.0, budget_s))
                conn.request("GET", g.get("path", "/"))
                r = conn.getresponse()
                r.read()
                log(f"{pod.name}/{cr.name}: {what} httpGet -> {r.status}")
            except (OSError, http.client.HTTPException) as exc:
                log(f"{pod.name}/{cr.name}: {what} httpGet failed: {exc}")
        elif "sleep" in hook:
            time.sleep(min(float(hook["sleep"]["seconds"]), budget_s))
        log(f"{pod.name}/{cr.name}: {what} hook took {time.monotonic() - t0:.2f} s")
