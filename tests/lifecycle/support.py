"""What the lifecycle tests share: start a role as a real process, wait until it is ready,
send it SIGTERM (by its PID) and watch what Kubernetes would see while it stops: its
readiness (probed every ``PROBE_S`` s until it exits), its exit code and time, and its
log (a start line naming host, port and pid; no traceback, Paddle ``FatalError`` or
``ImportError``).

The project's rule checked here: on SIGTERM a process turns its readiness false, finishes
the requests in flight, and exits 0 within its grace period.
"""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from runtime import proc

#: seconds between two readiness probes while a role stops
PROBE_S = 0.05
#: a stopping role must have exited this many seconds after SIGTERM
EXIT_BOUND_S = 30.0
#: lines that must never appear in a role's output (a crash, Paddle's own SIGTERM handler,
#: an import from a signal handler, a worker killed or failing)
FORBIDDEN = ("Traceback", "FatalError", "ImportError", "Termination signal", "Error in atexit",
             "Exception ignored", "was sent SIG", "exited with code", "Unhandled exception",
             "Segmentation fault")


def criteo_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` Criteo-format rows (label, 13 dense integers, 26 hex categoricals) for serving's
    raw-line inputs."""
    rng = np.random.default_rng(seed)
    dense = rng.integers(0, 300, (n, 13))
    cats = rng.integers(0, 400, (n, 26))
    return ["\t".join([str(i % 2)] + [str(x) for x in dense[i]] + [format(int(c), "x") for c in cats[i]])
            for i in range(n)]


def credentials(directory) -> tuple[dict[str, str], dict[str, str]]:
    """Writes a run's credentials under ``directory`` (``runtime.auth.write_credentials``);
    returns ``(env for the roles, the cube-control Authorization header)``."""
    from runtime import auth, role_specs

    d = auth.write_credentials(directory)
    return auth.env_for(d), auth.Credential(role_specs.CUBE_CONTROL, d).headers()


def start(group: proc.ProcessGroup, name: str, args: list[str], env: dict[str, str] | None = None) -> proc.Role:
    """Starts ``elastic-ctr ARGS`` as role ``name`` of ``group`` (its output in the
    group's log directory), ``env`` added to its environment, with a port file
    (``runtime.bound_ports``: read the ports it bound with ``group.bound_ports(role)``)."""
    return group.start(name, proc.self_command() + args, env={"GLOG_minloglevel": "2", **(env or {})},
                       port_file=True)


def wait_ready(role: proc.Role, url: str, timeout_s: float = 120.0) -> None:
    """Blocks until ``GET url`` answers 200. Raises ``RoleFailed`` if the process exits
    first, ``TimeoutError`` after ``timeout_s`` s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if role.proc.poll() is not None:
            raise proc.RoleFailed(role.name, role.proc.returncode, proc.tail(role.log_path, 60))
        try:
            r = requests.get(url, timeout=2)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as exc:
            last = type(exc).__name__
        time.sleep(0.1)
    raise TimeoutError(f"{role.name}: {url} not ready after {timeout_s:.0f} s (last: {last}); log:\n"
                       f"{proc.tail(role.log_path, 60)}")


def probe(url: str) -> int | str:
    """One readiness probe: the HTTP status, or why there was none (``"refused"``,
    ``"timeout"``, ``"reset"``)."""
    try:
        return requests.get(url, timeout=1.0).status_code
    except requests.ConnectTimeout:
        return "timeout"
    except requests.ReadTimeout:
        return "timeout"
    except requests.ConnectionError as exc:
        return "refused" if "refused" in str(exc).lower() else "reset"


@dataclass
class Stop:
    """What was seen while a role stopped: ``rc`` (exit code, None if it did not exit),
    ``seconds`` (from SIGTERM to exit), ``probes`` [(seconds after SIGTERM, result,
    process still alive after the probe)]."""

    rc: int | None
    seconds: float
    probes: list[tuple[float, int | str, bool]] = field(default_factory=list)

    def not_ready_while_alive(self) -> bool:
        """True when a probe saw readiness false (not 200) while the process was still up."""
        return any(res != 200 and alive for _, res, alive in self.probes)

    def ready_again_after_false(self) -> list:
        """Probes answering 200 after one had answered false (must be none)."""
        first = next((i for i, (_, res, _) in enumerate(self.probes) if res != 200), None)
        return [] if first is None else [p for p in self.probes[first:] if p[1] == 200]


class StopWatch:
    """Sends SIGTERM to ``role`` (its own PID only, as the kubelet does to a container's
    main process) and probes ``ready_url`` every ``PROBE_S`` s in a thread until the
    process exits. ``start()`` returns the monotonic time of the signal; ``result()``
    waits up to ``EXIT_BOUND_S`` s for the exit (SIGKILL to the group after that, so
    nothing outlives the test) and returns a ``Stop``."""

    def __init__(self, role: proc.Role, ready_url: str):
        self.role, self.url = role, ready_url
        self.t0 = 0.0
        self.probes: list[tuple[float, int | str, bool]] = []
        self._thread = threading.Thread(target=self._probe_loop, name="readiness-probe", daemon=True)

    def _probe_loop(self) -> None:
        p = self.role.proc
        while p.poll() is None and time.monotonic() - self.t0 < EXIT_BOUND_S + 5:
            t = time.monotonic() - self.t0
            res = probe(self.url)
            self.probes.append((round(t, 3), res, p.poll() is None))
            time.sleep(PROBE_S)

    def start(self) -> float:
        self.t0 = time.monotonic()
        os.kill(self.role.proc.pid, signal.SIGTERM)
        self._thread.start()
        return self.t0

    def result(self) -> Stop:
        p = self.role.proc
        try:
            p.wait(max(0.1, EXIT_BOUND_S - (time.monotonic() - self.t0)))
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: fall through to the kill
            pass
        seconds = time.monotonic() - self.t0
        rc = p.poll()
        if rc is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
        self._thread.join(timeout=5)
        return Stop(rc, seconds, list(self.probes))


def check_stop(stop: Stop, role: proc.Role, bound_s: float = EXIT_BOUND_S) -> None:
    """The rule: exit code 0 within ``bound_s`` s, readiness false while the process was
    still up (before it exited), never ready again after that."""
    log_tail = proc.tail(role.log_path, 80)
    assert stop.rc == 0, f"{role.name}: exit code {stop.rc} after {stop.seconds:.1f} s; log:\n{log_tail}"
    assert stop.seconds < bound_s, f"{role.name}: exited {stop.seconds:.1f} s after SIGTERM"
    assert stop.probes, f"{role.name}: no readiness probe was made before it exited"
    assert stop.not_ready_while_alive(), (
        f"{role.name}: readiness never false while the process was up: {stop.probes}")
    assert not stop.ready_again_after_false(), (
        f"{role.name}: ready again after readiness turned false: {stop.probes}")


def check_log(role: proc.Role, host: str, ports: list[int]) -> str:
    """The role's whole output: no line from ``FORBIDDEN``, and a start line naming
    ``host:port`` and the process's pid for each port in ``ports``. Returns the text."""
    text = Path(role.log_path).read_text(errors="replace")
    bad = [ln for ln in text.splitlines() if any(f in ln for f in FORBIDDEN)]
    assert not bad, f"{role.name}: forbidden lines in its output:\n" + "\n".join(bad) + f"\n--- log:\n{text[-6000:]}"
    pid = role.proc.pid
    for port in ports:
        pat = re.compile(rf"{re.escape(host)}:{port}\b.*\bpid {pid}\b")
        assert any(pat.search(ln) for ln in text.splitlines()), (
            f"{role.name}: no start line naming {host}:{port} and pid {pid}:\n{text[-4000:]}")
    return text
