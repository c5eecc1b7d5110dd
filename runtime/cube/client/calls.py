"""The pieces a cube client's seek is made of: a replica's connection pool, a request in flight, a shard's outcome, the scatter of the replies into the batch's order, and its result.

``runtime.cube.client.CubeClient`` picks the replicas, sends and gathers; what it holds per
replica (``ReplicaPool``), per request (``Call``) and per shard's answer (``Outcome``),
and how the answers become one batch (``scatter``, ``SeekResult``), are here.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

import numpy as np


def scatter(n: int, dim: int, idx: dict[int, np.ndarray], out: dict[int, "Outcome"]) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """The shards' replies put back in the batch's order: ``(values float32[n, dim],
    found bool[n])``; ``idx[s]``: the rows (int64) of the batch's keys on shard ``s``
    (``shard_rows``), ``out[s]``: its reply (``values`` float32[len(idx[s]), dim]). Every row
    is some shard's, so nothing is zero-filled first. A row of ``dim`` floats is moved as
    one item (a ``void`` view, ``np.put``), cheaper than 2-D fancy indexing into zeros.
    Raises ``ValueError`` when a reply's shape does not fit its rows."""
    values = np.empty((n, dim), np.float32)
    found = np.empty(n, bool)
    row = np.dtype((np.void, 4 * dim))
    rows_of = values.view(row).reshape(n)
    for s, i in idx.items():
        if not i.shape[0]:
            continue
        o = out[s]
        if o.values.shape != (i.shape[0], dim) or o.found.shape != i.shape:
            raise ValueError(f"cube shard {s}: a reply of {list(o.values.shape)} values for {i.shape[0]} keys "
                             f"of dim {dim}")
        np.put(rows_of, i, np.ascontiguousarray(o.values, dtype=np.float32).view(row).reshape(-1))
        np.put(found, i, o.found)
    return values, found


class ReplicaPool:
    """One server address with its pool of idle connections."""

    def __init__(self, addr: str, connect_timeout_s: float):
        host, _, port = addr.rpartition(":")
        self.addr, self.hostport = addr, (host or "127.0.0.1", int(port))
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[socket.socket] = []
        self.lock = threading.Lock()
        self.down_until = 0.0

    def get(self) -> socket.socket:
        """An idle pooled connection, else a new one. Raises ``OSError`` when it cannot
        connect."""
        with self.lock:
            if self.idle:
                return self.idle.pop()
        s = socket.create_connection(self.hostport, timeout=self.connect_timeout_s)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        return s

    def put(self, s: socket.socket) -> None:
        with self.lock:
            if len(self.idle) < 64:
                self.idle.append(s)
                return
        s.close()

    def close(self) -> None:
        with self.lock:
            for s in self.idle:
                s.close()
            self.idle.clear()


class Call:
    """One request in flight on one connection."""

    __slots__ = ("shard", "replica", "sock", "buf", "mv", "have", "total", "deadline", "backup")

    def __init__(self, shard, replica, sock, expect: int, deadline: float, backup: bool):
        self.shard, self.replica, self.sock = shard, replica, sock
        self.buf = bytearray(max(expect, 64))
        self.mv = memoryview(self.buf)
        self.have, self.total, self.deadline, self.backup = 0, 0, deadline, backup


class Outcome:
    """A shard's answer: OK (``found``/``values``) or VERSION_UNAVAILABLE (``held``)."""

    __slots__ = ("ok", "version", "other", "found", "values")

    def __init__(self, ok, version, other, found=None, values=None):
        self.ok, self.version, self.other, self.found, self.values = ok, version, other, found, values

    @property
    def held(self) -> set[int]:
        return {v for v in (self.version, self.other) if v}


@dataclass
class SeekResult:
    """``values`` float32[n, dim] (zeros for misses), ``found`` bool[n], ``version`` int."""

    values: np.ndarray
    found: np.ndarray
    version: int
