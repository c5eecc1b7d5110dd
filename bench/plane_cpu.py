"""The data plane's share of a server's CPU, for ``make bench-serving-peers``: how much of a
request the shared part costs (the input checks, the cube lookups' client side, the model
run), and so how far a server above it could go at all.

The KServe peer (``bench/kserve_peer.py``) and ``elastic-ctr serve`` answer with the same
data plane (``runtime.serving.dataplane.DataPlane.infer``); they differ only above it. A
peer worker times each ``DataPlane.infer`` call with ``time.thread_time`` (the calling
thread's CPU; Paddle runs the model on that thread, the lookups' waits cost none) and
keeps the running totals in ``<dir>/plane-<pid>``, one line ``<calls> <cpu_s>``, replaced
whole (a temporary file renamed over it) every ``RECORD_EVERY`` calls, so a reader sees
whole lines only. ``PlaneClock`` writes it, ``read_totals`` reads it: this module owns the
format.

``machine_ratio`` turns the figures into the bound: with both servers keeping the machine busy
(``wrk`` at a few connections, 2 workers each on 2 CPUs), requests/s go as the inverse of
the machine's CPU per request, the server's plus the cube servers' plus ``wrk``'s. A
server costing nothing above the data plane would need the data plane's CPU plus the
cube's and ``wrk``'s per request.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

#: calls between two writes of a worker's totals
RECORD_EVERY = 64
#: the totals' file name, followed by the worker's pid
PREFIX = "plane-"


class PlaneClock:
    """A worker's running totals of data-plane calls and their thread CPU (s), written to
    ``directory/plane-<pid>`` every ``every`` calls (module docstring). Thread-safe: each
    call is timed on the thread that makes it."""

    def __init__(self, directory: str | os.PathLike, every: int = RECORD_EVERY, pid: int | None = None):
        if every < 1:
            raise ValueError(f"every: {every}, at least 1 is needed")
        self.path = Path(directory) / f"{PREFIX}{os.getpid() if pid is None else pid}"
        self.every = every
        self.calls, self.cpu_s = 0, 0.0
        self._lock = threading.Lock()

    def start(self) -> float:
        """The thread's CPU time now (s): pass it to ``stop`` after the call."""
        return time.thread_time()

    def stop(self, started: float) -> None:
        """Counts one call that began at ``started`` (``start``'s value); writes the totals
        every ``every`` calls."""
        spent = time.thread_time() - started
        with self._lock:
            self.cpu_s += spent
            self.calls += 1
            if self.calls % self.every == 0:
                self._write()

    def write(self) -> None:
        """Replaces the totals' file with ``<calls> <cpu_s>``."""
        with self._lock:
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(f"{self.calls} {self.cpu_s:.9f}\n")
        os.replace(tmp, self.path)


def read_totals(directory: str | os.PathLike) -> dict[str, tuple[int, float]]:
    """``{file name: (calls, cpu_s)}`` of every worker's totals in ``directory`` (none yet:
    empty). Raises ``ValueError`` naming a file that is not one ``<calls> <cpu_s>`` line."""
    out = {}
    for p in sorted(Path(directory).glob(f"{PREFIX}*")):
        text = p.read_text()
        parts = text.split()
        try:
            if len(parts) != 2 or not text.endswith("\n"):
                raise ValueError
            calls, cpu_s = int(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"{p}: {text!r} is not one '<calls> <cpu_s>' line") from None
        out[p.name] = (calls, cpu_s)
    return out


def plane_ms(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> float | None:
    """Data-plane CPU ms per call between two ``read_totals`` readings (the calls counted in
    both; a worker that appeared in between counts from zero). None when no call was
    counted."""
    calls = cpu = 0.0
    for name, (c1, s1) in after.items():
        c0, s0 = before.get(name, (0, 0.0))
        calls += c1 - c0
        cpu += s1 - s0
    return cpu * 1e3 / calls if calls > 0 else None


def machine_ratio(peer: tuple[float, float, float], other: tuple[float, float, float]) -> float:
    """Requests/s of a server as a multiple of the peer's when the machine's CPU is what
    bounds both (module docstring): the peer's machine CPU per request over the other's.
    Each argument is ``(server_ms, cube_ms, wrk_ms)``: ms of CPU per request of the
    server's processes, of the cube servers and of ``wrk``. With the data plane's CPU as
    ``other``'s ``server_ms`` it is the ceiling: what a server costing nothing above the
    data plane could reach. Raises ``ValueError`` for a figure that is negative or not a
    number, or an ``other`` adding up to 0."""
    bad = [f"{who}[{k}]={v!r}" for who, costs in (("peer", peer), ("other", other)) for k, v in enumerate(costs)
           if not v >= 0]
    if bad:
        raise ValueError(f"machine_ratio: {', '.join(bad)}: CPU ms per request must be >= 0")
    if sum(other) <= 0:
        raise ValueError("machine_ratio: other's CPU per request adds up to 0: nothing to compare with")
    return sum(peer) / sum(other)
