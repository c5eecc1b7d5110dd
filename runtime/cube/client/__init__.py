"""Cube client: sharded and replicated, ``CubeClient.seek(keys) -> SeekResult``.

- Topology: ``shards x replicas`` (``runtime.formats.topology``); shard of a
  key: ``runtime.formats.topology.shard_rows`` (``key % shard_num``, as the builder).
- One ``seek`` splits the batch by shard, sends every shard's request first and then
  gathers the replies with ``poll`` (the shards work concurrently, no threads), over
  persistent pooled connections (one pool per replica; a connection carries one request
  at a time). Replicas are chosen round-robin, skipping one that failed in the last
  ``down_s`` seconds.
- ``timeout_ms`` bounds each attempt; on a timeout, a connection error, or a replica
  that has nothing loaded, the shard's request is retried on the next replica, up to
  ``retries`` more times. ``backup_request_ms``: when a shard has not answered after that
  long, the same request also goes to another replica and the first reply wins.
  A shard with no replica answering raises ``CubeUnavailable``.
- Version pinning (one version for the whole batch): every reply carries the version it
  was answered from and the other version the replica holds (its previous one). If the
  shards answered from different versions, the client picks the NEWEST version that every
  shard reported holding (current or previous) and re-asks, naming it, only the shards
  that answered from another one. While a switch propagates (some shards on the new
  version with the old one as previous, some still on the old one), that is the old
  version; once all shards switched, the new one. If no version is common (a replica
  moved two versions ahead, or one restarted or added empty is being brought through the
  served chain), it re-asks the others naming the version most shards hold (the newest
  of those), where a replica not holding it is skipped for another; a version named once
  is not named again (some shard had no replica holding it: the next candidate); at most
  ``pin_rounds`` rounds, then it raises ``CubeVersionUnavailable``. With ``seek(keys, version=V)`` every shard is
  asked for V; a replica not holding V is skipped for another one.
- Thread-safe: any number of threads may call ``seek`` on one client (each call uses its
  own connections, taken from and returned to the locked pools).
- The common case runs in C (``native``, the default when no backup requests are asked):
  one replica per shard, every request sent, the replies read and put back in the batch's
  order by ``kernel.c``'s ``cube_client_seek`` with the GIL released. When anything is
  not plain (a shard failing, timing out or answering other than OK, versions differing,
  the first seek that learns ``dim``), its outcome is applied as the Python path would
  (a replica that failed, timed out, garbled its reply or refused the request with
  BAD_REQUEST, TOO_LARGE or SERVER_ERROR is marked down and its connection closed; one
  that answered VERSION_UNAVAILABLE or NOT_READY is not) and the batch goes through the
  Python path described here, from the start; so the C attempt adds one attempt before
  the ``retries``, on replicas then marked down.
"""
from __future__ import annotations

import itertools
import select
from collections import Counter
import socket
import time

import numpy as np

from runtime.cube import kernel, protocol
from runtime.cube.client.calls import Call, Outcome, ReplicaPool, SeekResult, scatter
from runtime.formats.topology import Topology, shard_rows


class CubeUnavailable(RuntimeError):
    """A shard had no replica answering (within timeout and retries); names the shard and
    the replicas tried."""


class CubeVersionUnavailable(CubeUnavailable):
    """No single version could be served for the whole batch (or the version asked for)."""


class CubeClient:
    """See the module docstring. ``shards``: per shard, its replicas' ``host:port``."""

    def __init__(self, shards: list[list[str]], dict_name: str = "", timeout_ms: float = 500.0,
                 retries: int = 2, backup_request_ms: float | None = None, down_s: float = 1.0,
                 pin_rounds: int = 4, native: bool = True):
        if not shards or any(not r for r in shards):
            raise ValueError("topology needs at least one shard, each with at least one replica")
        self.dict_name = dict_name
        self.timeout_s = timeout_ms / 1000.0
        self.retries = int(retries)
        self.backup_s = None if backup_request_ms is None else backup_request_ms / 1000.0
        self.down_s = down_s
        self.pin_rounds = pin_rounds
        self.shards = [[ReplicaPool(a, self.timeout_s) for a in reps] for reps in shards]
        self.shard_num = len(shards)
        self._rr = [itertools.count() for _ in shards]
        self._dim: int | None = None
        self._rid = itertools.count(1)
        self.native = bool(native) and self.backup_s is None
        self.native_fallbacks = 0  # seeks the C path handed to the Python path

    @classmethod
    def from_topology(cls, source, timeout_ms: float = 500.0, retries: int = 2,
                      backup_request_ms: float | None = None, **kw) -> "CubeClient":
        """From a topology (``runtime.formats.topology``: a file path, a parsed document or a
        ``Topology``). Raises ``TopologyError`` naming the file and field."""
        topo = Topology.load(source)
        return cls(topo.servers(), topo.dict_name, timeout_ms=timeout_ms, retries=retries,
                   backup_request_ms=backup_request_ms, **kw)

    @property
    def dim(self) -> int:
        """Floats per value (asks shard 0 with an empty batch the first time)."""
        if self._dim is None:
            self.seek(np.empty(0, np.uint64))
        return self._dim

    def close(self) -> None:
        """Closes every pooled connection."""
        for reps in self.shards:
            for r in reps:
                r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ seek
    def seek(self, keys: np.ndarray, version: int | None = None) -> SeekResult:
        """``keys: uint64[n]`` -> ``SeekResult(values float32[n, dim], found bool[n], version)``.

        Raises ``CubeUnavailable`` (a shard unreachable) or ``CubeVersionUnavailable``."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if self.native and self._dim and keys.shape[0]:
            res = self._seek_native(keys, version)
            if res is not None:
                return res
            self.native_fallbacks += 1
        S = self.shard_num
        if S == 1:
            parts, idx = {0: keys}, None
        else:
            idx = dict(enumerate(shard_rows(keys, S)))
            parts = {s: keys[i] for s, i in idx.items() if i.shape[0]}
            if not parts:
                parts = {0: keys[:0]}
        out = self._gather(parts, version)
        pinned: set[int] = set()  # versions already named in a re-ask
        for _ in range(self.pin_rounds):
            versions = {o.version for o in out.values() if o.ok}
            if all(o.ok for o in out.values()) and len(versions) == 1:
                break
            empty = [s for s, o in out.items() if not o.ok and not o.held]
            if empty:
                raise CubeUnavailable(f"cube shard(s) {empty}: no replica has a version loaded")
            if version is not None:
                bad = [s for s, o in out.items() if not o.ok]
                raise CubeVersionUnavailable(
                    f"version {version} is not held by shard(s) {bad} "
                    f"(they hold {[sorted(out[s].held) for s in bad]})")
            common = set.intersection(*(o.held for o in out.values())) - pinned
            if common:
                target = max(common)
            else:  # a replica lags (being brought back) or ran ahead: the version most shards hold
                held = Counter(v for o in out.values() for v in o.held if v not in pinned)
                if not held:
                    out = self._gather(parts, None)
                    continue
                target = max(held, key=lambda v: (held[v], v))
            pinned.add(target)  # not named again: if a shard has no replica holding it, the next candidate
            redo = {s: parts[s] for s, o in out.items() if not (o.ok and o.version == target)}
            out.update(self._gather(redo, target))
        else:
            raise CubeVersionUnavailable(
                f"no version common to every shard after {self.pin_rounds} rounds: "
                f"{ {s: sorted(o.held) for s, o in out.items()} }")
        first = next(iter(out.values()))
        ver = first.version
        dim = first.values.shape[1]
        self._dim = dim
        if idx is None:
            return SeekResult(first.values, first.found, ver)
        return SeekResult(*scatter(keys.shape[0], dim, idx, out), ver)

    def _seek_native(self, keys: np.ndarray, version: int | None) -> SeekResult | None:
        """``seek``'s common case in C (module docstring): ``keys: uint64[n]`` (n > 0,
        ``dim`` known). Returns None when the batch needs the Python path."""
        S, n, dim = self.shard_num, keys.shape[0], self._dim
        picked: list[tuple[ReplicaPool, socket.socket]] = []
        try:
            for s in range(S):
                r = self._pick(s, ())
                picked.append((r, r.get()))
        except OSError:
            r.down_until = time.monotonic() + self.down_s
            for r, sock in picked:
                r.put(sock)
            return None
        fds = np.array([sock.fileno() for _, sock in picked], np.int32)
        values = np.empty((n, dim), np.float32)
        found = np.empty(n, bool)
        meta = np.zeros(3 * S, np.int64)  # per shard: outcome, version, other
        rc = kernel.KERNEL.client_seek_raw(
            keys.ctypes.data, n, S, fds.ctypes.data, dim, int(version or 0),
            int(self.timeout_s * 1e6), values.ctypes.data, found.ctypes.data, meta.ctypes.data)
        outcome = meta[0::3].tolist() if rc >= 0 else [kernel.SEEK_NONE] * S
        for (r, sock), o in zip(picked, outcome):
            if o in (protocol.OK, protocol.VERSION_UNAVAILABLE, protocol.NOT_READY, kernel.SEEK_NONE):
                r.put(sock)  # the connection is in step: its reply was read whole, or nothing was sent
                continue
            # failed, timed out, malformed, or refused (BAD_REQUEST, TOO_LARGE, SERVER_ERROR: the
            # server may have closed it): down, as the Python path marks it
            sock.close()
            r.down_until = time.monotonic() + self.down_s
        if rc != 0:
            return None
        versions = {v for o, v in zip(outcome, meta.view(np.uint64)[1::3].tolist()) if o == protocol.OK}
        if len(versions) != 1:
            return None  # shards answered from different versions: pinning (Python path)
        return SeekResult(values, found, versions.pop())

    def probe(self, version: int) -> SeekResult:
        """Asks EVERY shard for ``version`` (one key per shard: key ``i`` lives on shard
        ``i``, ``key % shard_num``), each on a replica holding it (an empty or lagging
        replica is skipped for another). Serving calls it before it serves a version.
        Raises ``CubeVersionUnavailable`` (a shard has no replica holding ``version``) or
        ``CubeUnavailable``."""
        return self.seek(np.arange(self.shard_num, dtype=np.uint64), version=int(version))

    def _pick(self, shard: int, avoid: set) -> ReplicaPool | None:
        reps = self.shards[shard]
        now = time.monotonic()
        start = next(self._rr[shard])
        best = None
        for j in range(len(reps)):
            r = reps[(start + j) % len(reps)]
            if r in avoid:
                continue
            if r.down_until <= now:
                return r
            if best is None:
                best = r
        return best

    def _send(self, shard, frame, expect, avoid, tried, backup=False) -> Call | None:
        """Sends ``frame`` to a replica of ``shard`` not in ``avoid``; None if none left."""
        while True:
            r = self._pick(shard, avoid)
            if r is None:
                return None
            avoid.add(r)
            tried.append(r.addr)
            try:
                s = r.get()
                try:
                    s.sendall(frame)  # small request: fits the socket buffer
                except BlockingIOError:
                    s.setblocking(True)
                    s.settimeout(self.timeout_s)
                    s.sendall(frame)
                    s.setblocking(False)
            except OSError:
                r.down_until = time.monotonic() + self.down_s
                if len(tried) > self.retries:
                    return None
                continue
            return Call(shard, r, s, expect, time.monotonic() + self.timeout_s, backup)

    def _gather(self, parts: dict[int, np.ndarray], version: int | None) -> dict[int, Outcome]:
        dim = self._dim or 0
        frames = {s: protocol.encode_request(k, version) for s, k in parts.items()}
        expect = {s: protocol.reply_size(k.shape[0], dim) for s, k in parts.items()}
        avoid = {s: set() for s in parts}
        tried = {s: [] for s in parts}
        calls: dict[int, Call] = {}
        out: dict[int, Outcome] = {}
        pending: dict[int, list[Call]] = {}
        for s in parts:
            c = self._send(s, frames[s], expect[s], avoid[s], tried[s])
            if c is None:
                self._fail(s, tried[s], calls)
            pending[s] = [c]
            calls[c.sock.fileno()] = c
        poller = select.poll()
        for fd in calls:
            poller.register(fd, select.POLLIN)
        backup_at = time.monotonic() + self.backup_s if self.backup_s is not None else None
        try:
            while len(out) < len(parts):
                now = time.monotonic()
                wake = min(c.deadline for c in calls.values())
                if backup_at is not None:
                    wake = min(wake, backup_at)
                events = poller.poll(max(0.0, wake - now) * 1000.0) if wake > now else []
                for fd, ev in events:
                    c = calls.get(fd)
                    if c is None or c.shard in out:
                        continue
                    res = self._recv(c)
                    if res is None:
                        continue  # incomplete
                    del calls[fd]
                    poller.unregister(fd)
                    if isinstance(res, Exception):  # connection failed: next replica
                        c.sock.close()
                        c.replica.down_until = time.monotonic() + self.down_s
                        self._retry(c, frames, expect, avoid, tried, calls, pending, poller)
                        continue
                    if res.ok or res.version or not self._has_other(c.shard, avoid):
                        # OK, or VERSION_UNAVAILABLE from a replica that holds something
                        if not res.ok and version is not None and self._has_other(c.shard, avoid) \
                                and len(tried[c.shard]) <= self.retries:
                            c.replica.put(c.sock)
                            self._retry(c, frames, expect, avoid, tried, calls, pending, poller)
                            continue
                        c.replica.put(c.sock)
                        out[c.shard] = res
                        for other in pending[c.shard]:  # a backup that lost the race
                            if other is not c and other.sock.fileno() in calls:
                                poller.unregister(other.sock.fileno())
                                del calls[other.sock.fileno()]
                                other.sock.close()
                    else:  # NOT_READY: try another replica
                        c.replica.put(c.sock)
                        self._retry(c, frames, expect, avoid, tried, calls, pending, poller)
                now = time.monotonic()
                for fd, c in list(calls.items()):
                    if c.deadline <= now and c.shard not in out:
                        del calls[fd]
                        poller.unregister(fd)
                        c.sock.close()
                        c.replica.down_until = now + self.down_s
                        if not any(o is not c and o.sock.fileno() in calls for o in pending[c.shard]):
                            self._retry(c, frames, expect, avoid, tried, calls, pending, poller)
                if backup_at is not None and now >= backup_at:
                    backup_at = None
                    for s in parts:
                        if s not in out and self._has_other(s, avoid[s]):
                            b = self._send(s, frames[s], expect[s], avoid[s], tried[s], backup=True)
                            if b is not None:
                                pending[s].append(b)
                                calls[b.sock.fileno()] = b
                                poller.register(b.sock.fileno(), select.POLLIN)
        except BaseException:
            for c in calls.values():
                c.sock.close()
            raise
        return out

    def _has_other(self, shard, avoid) -> bool:
        avoid = avoid if isinstance(avoid, set) else avoid[shard]
        return any(r not in avoid for r in self.shards[shard])

    def _retry(self, c, frames, expect, avoid, tried, calls, pending, poller) -> None:
        s = c.shard
        n = None
        if len(tried[s]) <= self.retries:
            n = self._send(s, frames[s], expect[s], avoid[s], tried[s])
        if n is None:
            if any(o.sock.fileno() in calls for o in pending[s] if o is not c):
                return  # a backup request is still in flight
            for o in calls.values():
                o.sock.close()
            self._fail(s, tried[s], {})
        pending[s].append(n)
        calls[n.sock.fileno()] = n
        poller.register(n.sock.fileno(), select.POLLIN)

    def _fail(self, shard, tried, calls) -> None:
        for c in calls.values():
            c.sock.close()
        raise CubeUnavailable(f"cube shard {shard}: no replica answered within {self.timeout_s * 1000:.0f} ms "
                              f"and {self.retries} retries (tried {tried})")

    def _recv(self, c: Call):
        """Reads what is available. Returns None (incomplete), an ``Outcome``, or an
        exception (connection closed or failed, malformed reply)."""
        try:
            while True:
                want = (c.total or len(c.buf)) - c.have
                n = c.sock.recv_into(c.mv[c.have:c.have + want])
                if n == 0:
                    return ConnectionError(f"{c.replica.addr} closed the connection")
                c.have += n
                if not c.total and c.have >= 4:
                    c.total = protocol.LEN.unpack_from(c.buf, 0)[0] + 4
                    if c.total > len(c.buf):
                        nb = bytearray(c.total)
                        nb[:c.have] = c.mv[:c.have]
                        c.buf, c.mv = nb, memoryview(nb)
                if c.total and c.have >= c.total:
                    break
        except BlockingIOError:
            return None
        except OSError as exc:
            return exc
        try:
            _, version, other, found, values = protocol.decode_reply(c.mv[:c.total])
        except protocol.ReplyError as exc:
            if exc.status in (protocol.VERSION_UNAVAILABLE, protocol.NOT_READY):
                return Outcome(False, exc.version, exc.other)
            return ConnectionError(f"{c.replica.addr}: {exc}")
        except ValueError as exc:
            return exc
        return Outcome(True, version, other, found, values)
