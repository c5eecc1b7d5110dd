"""Cube server: one shard of one dict, served over the binary data plane, controlled over HTTP.

Data plane (``--port``, default 8900): the protocol in ``runtime/cube/protocol.py``.
Per request: ``recv_into`` a per-connection preallocated buffer, one C call
(``kernel.c`` ``cube_table_lookup``, GIL released) that probes the version's inline table
(``runtime/cube/table.py``: key and values in one slot, built at load time from the dict's
keys/values, which are then dropped) and writes the found mask and the values straight
into a preallocated reply buffer, one send. No per-key Python, no
per-request allocation (buffers grow only for bigger batches).
I/O mode (``--io-mode``): ``epoll`` (default) multiplexes every connection on one thread;
``threads`` runs a blocking loop per connection and pays for GIL hand-offs between them
(the README's benchmarks give both).

Versions: ``current`` (served), ``prev`` (the version served before the last enable, still
answered when a request names it, so a client can finish a batch on one version across
shards while a switch propagates; dropped when the next load begins), and the
background slot (``bg``) being loaded. ``enable`` swaps one reference (atomic for the
readers); a patch is merged into a new table (``InlineTable.upsert``: a copy of the served
one, or a larger rehash of it; copy on write), so the served table keeps answering.

HTTP control (``--http-port``, default 8901), as docs/contracts.md:
``GET /status``, ``POST /bg_load_base {"dir", "version"}``, ``POST /bg_load_patch {"dir",
"version", "base_version"}`` (409 unless ``base_version`` is the served version),
``POST /enable {"version"}`` (409 unless the bg slot holds it, loaded; 200 when it is
already served), ``POST /bg_unload``, ``GET /healthz``, ``GET /metrics`` (Prometheus).

Stopping (SIGTERM, ``main``): readiness (``GET /readyz`` on the HTTP port) turns false,
the data plane keeps answering for ``--drain-seconds``, then accepts no new connection,
answers every request it has received (a frame partly received included) and closes each
connection once nothing on it is unanswered (``--stop-timeout`` at most; a client then
reconnects to another replica), stops the HTTP port (its requests in flight finish), and
the process exits 0.

``--data-dir``: the enabled version's chain of dict directories (base + patches) is
recorded in ``<data-dir>/state.json``; a restarted server reloads and serves it, unless a
dict of the chain is not this server's dict name, shard and ``--shard-num`` (a resize: it
then starts empty, logged, and the transfer lays the version out for the new shard count).
Loads check the same against the dict's meta, so a server never serves another layout.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import select
import socket
import struct
import termios
import threading
import time
from pathlib import Path

import numpy as np

from runtime.cube import dictfile, protocol
from runtime.cube.kernel import KERNEL
from runtime.cube.table import InlineTable

log = logging.getLogger(__name__)


class _Slot:
    """A loaded version, ready for the hot path: its inline table (``runtime/cube/table.py``;
    the dict's keys/values arrays are not kept). ``lineage``: the versions it is made of
    (base first, then each patch applied). ``chain``: their dict directories. ``args``: the
    table's leading arguments of ``KERNEL.table_lookup_raw``."""

    __slots__ = ("t", "version", "dim", "args", "lineage", "chain")

    def __init__(self, t: InlineTable, version: int, lineage: list[int], chain: list[dict]):
        self.t = t
        self.version = version
        self.dim = t.dim
        self.lineage = lineage
        self.chain = chain
        self.args = (t.tab.ctypes.data, t.capacity, t.stride, t.sentinel, t.dim)


class _ConnStats:
    __slots__ = ("requests", "keys", "hits", "errors")

    def __init__(self):
        self.requests = self.keys = self.hits = 0
        self.errors: dict[int, int] = {}


class _Buf:
    """A bytearray with its address (for the C kernel) and a memoryview."""

    __slots__ = ("b", "mv", "addr", "_c")

    def __init__(self, size: int):
        self.b = bytearray(size)
        self.mv = memoryview(self.b)
        self._c = (ctypes.c_char * size).from_buffer(self.b)
        self.addr = ctypes.addressof(self._c)


class _Conn:
    """A data-plane connection's state: request buffer (``have`` bytes used), reply
    buffer, stats, and its send function."""

    __slots__ = ("sock", "st", "send", "rin", "rout", "have")

    def __init__(self, sock, st, send):
        self.sock, self.st, self.send = sock, st, send
        self.rin = _Buf(protocol.REQ_PREFIX + 8 * 1024)
        self.rout = _Buf(protocol.reply_size(1024, 16))
        self.have = 0


def _send_nonblocking(sock: socket.socket, data, timeout_s: float = 10.0) -> None:
    """``sendall`` for a non-blocking socket: waits (bounded) while the send buffer is full."""
    mv = memoryview(data)
    while mv:
        try:
            n = sock.send(mv)
            mv = mv[n:]
        except BlockingIOError:
            if not select.select([], [sock], [], timeout_s)[1]:
                raise TimeoutError("client not reading its replies")


def _has_unread(sock: socket.socket) -> bool:
    """True when bytes sent by the client wait unread in ``sock`` (False at EOF or error)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False


_TIOCOUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: SIOCOUTQ, bytes not yet acknowledged


def _unacked(sock: socket.socket) -> int:
    """Bytes of replies in ``sock``'s send queue the client has not acknowledged (0 where
    the platform cannot tell)."""
    if _TIOCOUTQ is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _idle(sock: socket.socket, c: "_Conn") -> bool:
    """A connection a stopping server may close without losing anything: no partial
    request held, nothing unread, and every reply byte acknowledged by the client (closing
    with unread bytes, or one arriving on a closed socket, resets the connection, and a
    reset drops what is still queued)."""
    return c.have == 0 and not _has_unread(sock) and _unacked(sock) == 0


class CubeServer:
    """One shard server. ``start()`` binds both ports and starts the threads;
    ``stop()`` closes them. ``port``/``http_port`` hold the bound ports (0 = any free)."""

    def __init__(self, shard: int, shard_num: int, dict_name: str, host: str = "0.0.0.0",
                 port: int = 8900, http_port: int = 8901, data_dir: str | None = None,
                 max_keys: int = protocol.DEFAULT_MAX_KEYS, verify: bool = True, io_mode: str = "epoll"):
        if not 0 <= shard < shard_num:
            raise ValueError(f"shard {shard} out of range for shard_num {shard_num}")
        self.shard, self.shard_num, self.dict_name = shard, shard_num, dict_name
        self.host, self.port, self.http_port = host, port, http_port
        self.data_dir = Path(data_dir) if data_dir else None
        self.max_keys = max_keys
        self.max_frame = protocol.REQ_HEADER.size + 8 * max_keys
        self.verify = verify
        if io_mode not in ("threads", "epoll"):
            raise ValueError(f"io_mode must be threads or epoll, got {io_mode!r}")
        self.io_mode = io_mode
        self._ep = select.epoll() if io_mode == "epoll" else None
        self._econns: dict[int, _Conn] = {}
        # (current, prev): replaced as a whole, read without a lock by the data plane
        self._served: tuple[_Slot | None, _Slot | None] = (None, None)
        self._lock = threading.Lock()  # control operations
        self.bg: _Slot | None = None
        self.bg_state, self.bg_error, self.bg_version = "empty", None, None
        self._bg_gen = 0
        self._stats: list[_ConnStats] = []
        self._closed_stats = _ConnStats()
        self._conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self.loads = {"ok": 0, "failed": 0}
        self.enables = 0
        self._stop = threading.Event()
        self._draining = threading.Event()  # graceful stop: close each connection once idle
        self._tconns: dict[socket.socket, _Conn] = {}  # threads mode: the connections' state
        self._sock: socket.socket | None = None
        self._http = None  # runtime.webserver.WebServer of the control app
        self.started = time.time()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(1024)
        self._sock = s
        self.port = s.getsockname()[1]
        from runtime.webserver import WebServer

        self._http = WebServer(create_control_app(self), self.host, self.http_port, threads=4, name="cube-server")
        self.http_port = self._http.port
        threading.Thread(target=self._accept_loop, name="cube-accept", daemon=True).start()
        if self.io_mode == "epoll":
            threading.Thread(target=self._epoll_loop, name="cube-epoll", daemon=True).start()
        self._http.start()
        self._warm()
        self._restore()
        log.info("cube server %s shard %d/%d: data plane %s:%d, HTTP %s:%d, kernel %s, pid %d",
                 self.dict_name, self.shard, self.shard_num, self.host, self.port, self.host,
                 self.http_port, KERNEL.name, os.getpid())

    def unready(self, reason: str = "stopping") -> None:
        """Readiness false (``GET /readyz`` answers 503 with ``reason``); serving goes on."""
        if self._http is not None:
            self._http.ready, self._http.reason = False, reason

    def stop(self, grace_s: float = 0.0) -> None:
        """Stops serving; idempotent. ``grace_s`` > 0 is a graceful stop: readiness false,
        no new data-plane connection, every request already received (a frame partly
        received too) is answered, each connection is closed once nothing on it is
        unanswered, for up to ``grace_s`` s; then the HTTP port stops (its requests in
        flight finish) and any connection left is shut. ``grace_s`` 0: all at once."""
        if self._http is not None and self._http.ready:
            self.unready("stopping")
        self._draining.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
            except OSError:
                pass
            self._sock.close()
        if grace_s > 0:
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.io_mode == "threads":
                    self._close_idle_threads()
                with self._conn_lock:
                    if not self._conns:
                        break
                time.sleep(0.02)
            with self._conn_lock:
                left = len(self._conns)
            if left:
                log.warning("%d data-plane connection(s) still busy after %.1f s: closing them", left, grace_s)
        self._stop.set()
        if self._http is not None:
            self._http.stop()
        with self._conn_lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _close_idle_threads(self) -> None:
        """threads mode, stopping: ends the read of each connection holding no partial
        request and nothing unread (its thread's ``recv`` returns 0 and it closes)."""
        for sock, c in list(self._tconns.items()):
            if _idle(sock, c):
                try:
                    sock.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

    def _warm(self) -> None:
        """Runs the kernel once so the first request pays no load/compile cost."""
        InlineTable.build(np.arange(4, dtype=np.uint64), np.zeros((4, 1), np.float32)).upsert(
            np.arange(2, 6, dtype=np.uint64), np.ones((4, 1), np.float32)).lookup(np.arange(8, dtype=np.uint64))

    # ------------------------------------------------------------------ data plane
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stop.is_set() or self._draining.is_set():
                    return
                time.sleep(0.01)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.io_mode == "threads":
                threading.Thread(target=self._serve_conn, args=(conn,), name="cube-conn", daemon=True).start()
            else:
                self._epoll_add(conn)

    def _register(self, sock) -> _ConnStats:
        st = _ConnStats()
        with self._conn_lock:
            self._conns.add(sock)
            self._stats.append(st)
        return st

    def _unregister(self, sock, st: _ConnStats) -> None:
        with self._conn_lock:
            self._conns.discard(sock)
            if st in self._stats:
                self._stats.remove(st)
            c = self._closed_stats
            c.requests += st.requests
            c.keys += st.keys
            c.hits += st.hits
            for k, v in st.errors.items():
                c.errors[k] = c.errors.get(k, 0) + v
        sock.close()

    def _serve_conn(self, sock: socket.socket) -> None:
        """threads mode: one blocking loop per connection."""
        c = _Conn(sock, self._register(sock), sock.sendall)
        self._tconns[sock] = c
        recv_into = sock.recv_into
        try:
            while True:
                n = recv_into(c.rin.mv[c.have:])
                if not n:
                    return
                c.have += n
                if not self._drain(c):
                    return
                if self._draining.is_set() and _idle(sock, c):
                    return  # stopping: everything received is answered and delivered
        except (ConnectionError, OSError):
            pass
        except Exception:  # a bug must not take the server down: log, drop this connection
            log.exception("data-plane connection failed")
        finally:
            self._tconns.pop(sock, None)
            self._unregister(sock, c.st)

    # epoll mode: one thread multiplexes every connection (no GIL hand-offs between threads)
    def _epoll_add(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        c = _Conn(sock, self._register(sock), None)
        c.send = lambda data, _s=sock: _send_nonblocking(_s, data)
        self._econns[sock.fileno()] = c
        self._ep.register(sock.fileno(), select.EPOLLIN)

    def _epoll_loop(self) -> None:
        ep, conns = self._ep, self._econns
        while not self._stop.is_set():
            draining = self._draining.is_set()
            try:
                events = ep.poll(0.02 if draining else 0.5)
            except InterruptedError:
                continue
            for fd, _ in events:
                c = conns.get(fd)
                if c is None:
                    continue
                keep = True
                try:
                    n = c.sock.recv_into(c.rin.mv[c.have:])
                    if not n:
                        keep = False
                    else:
                        c.have += n
                        keep = self._drain(c)
                except (BlockingIOError, InterruptedError):
                    continue
                except (ConnectionError, OSError):
                    keep = False
                except Exception:
                    log.exception("data-plane connection failed")
                    keep = False
                if not keep:
                    self._epoll_close(fd, c)
            if draining:  # stopping: close each connection with nothing left to answer
                for fd, c in list(conns.items()):
                    if _idle(c.sock, c):
                        self._epoll_close(fd, c)

    def _epoll_close(self, fd: int, c: "_Conn") -> None:
        try:
            self._ep.unregister(fd)
        except (OSError, ValueError):
            pass
        self._econns.pop(fd, None)
        self._unregister(c.sock, c.st)

    def _drain(self, c: "_Conn") -> bool:
        """Answers every complete request frame in ``c.rin``. False: close the connection."""
        unpack_req, pack_rep = protocol.REQ_HEADER.unpack_from, protocol.REP_FRAME.pack_into
        lookup_raw = KERNEL.table_lookup_raw
        hdr = protocol.REQ_HEADER.size
        st = c.st
        while c.have >= 4:
            rin = c.rin
            (length,) = protocol.LEN.unpack_from(rin.b, 0)
            if length > self.max_frame:
                self._error(c, protocol.TOO_LARGE, 0, f"frame of {length} bytes exceeds the limit of "
                                               f"{self.max_frame} ({self.max_keys} keys)")
                return False
            if length < hdr:
                self._error(c, protocol.BAD_REQUEST, 0, f"frame of {length} bytes is shorter than the header")
                return False
            total = length + 4
            if total > len(rin.b):
                nb = _Buf(total)
                nb.b[:c.have] = rin.mv[:c.have]
                c.rin = nb
                return True  # read the rest first
            if c.have < total:
                return True
            magic, op, flags, _, rid, count, _, want = unpack_req(rin.b, 4)
            if magic != protocol.MAGIC or op != protocol.OP_SEEK or length != hdr + 8 * count:
                self._error(c, protocol.BAD_REQUEST, rid,
                            f"bad request (magic {magic:#x}, op {op}, length {length}, count {count})")
                return False
            cur, prev = self._served
            slot = cur
            if cur is None:
                slot = None
                status = protocol.NOT_READY
            elif flags & 1 and want != cur.version:
                slot = prev if prev is not None and prev.version == want else None
                status = protocol.VERSION_UNAVAILABLE
            if slot is None:
                self._error(c, status, rid,
                            "no version loaded" if status == protocol.NOT_READY else
                            f"version {want} not held (serving {cur.version}, previous "
                            f"{prev.version if prev else None})", close=False)
            else:
                dim = slot.dim
                mask = (count + 7) & ~7
                size = protocol.REP_PREFIX + mask + 4 * count * dim
                rout = c.rout
                if size > len(rout.b):
                    rout = c.rout = _Buf(size)
                base = rout.addr + protocol.REP_PREFIX
                if lookup_raw is not None:
                    hits = lookup_raw(*slot.args, rin.addr + protocol.REQ_PREFIX, count, base + mask, base, None)
                else:
                    hits = self._lookup_py(slot, rin, count, rout, mask)
                pack_rep(rout.b, 0, size - 4, protocol.MAGIC, protocol.OK, 0, 0, rid, count, dim, slot.version,
                         (prev.version if slot is cur else cur.version) if prev is not None else 0)
                c.send(rout.mv[:size])
                st.requests += 1
                st.keys += count
                st.hits += hits
            # keep any pipelined bytes that followed this frame
            if c.have > total:
                rin.b[:c.have - total] = rin.mv[total:c.have]
            c.have -= total
        return True

    @staticmethod
    def _lookup_py(slot: _Slot, rin: _Buf, count: int, rout: _Buf, mask: int) -> int:
        q = np.frombuffer(rin.b, np.uint64, count, protocol.REQ_PREFIX)
        found = np.frombuffer(rout.b, np.uint8, count, protocol.REP_PREFIX)
        out = np.frombuffer(rout.b, np.float32, count * slot.dim, protocol.REP_PREFIX + mask)
        t = slot.t
        return KERNEL.table_lookup(t.tab, t.tabf, t.sentinel, t.dim, q, out.reshape(count, slot.dim), found)

    def _error(self, c: "_Conn", status: int, rid: int, msg: str, close: bool = True) -> None:
        c.st.errors[status] = c.st.errors.get(status, 0) + 1
        cur, prev = self._served
        frame = protocol.encode_error(status, rid, cur.version if cur else 0, prev.version if prev else 0, msg)
        if close:
            log.warning("data plane: %s: %s; closing the connection", protocol.STATUS_NAMES[status], msg)
        try:
            c.send(frame)
        except OSError:
            pass

    # ------------------------------------------------------------------ control
    def status(self) -> dict:
        cur, prev = self._served
        return {"shard": self.shard, "shard_num": self.shard_num, "dict_name": self.dict_name,
                "version": cur.version if cur else None, "prev_version": prev.version if prev else None,
                "bg_version": self.bg_version, "bg_state": self.bg_state, "bg_error": self.bg_error,
                "keys": len(cur.t) if cur else 0, "dim": cur.dim if cur else None,
                "lineage": cur.lineage if cur else [], "kernel": KERNEL.name,
                "connections": len(self._conns), **self.counters()}

    def counters(self) -> dict:
        with self._conn_lock:
            stats = self._stats + [self._closed_stats]
            out = {"requests": sum(s.requests for s in stats), "keys_looked_up": sum(s.keys for s in stats),
                   "hits": sum(s.hits for s in stats), "errors": {}}
            for s in stats:
                for k, v in s.errors.items():
                    name = protocol.STATUS_NAMES[k]
                    out["errors"][name] = out["errors"].get(name, 0) + v
        return out

    def bg_load(self, directory: str, version: int, base_version: int | None = None) -> None:
        """Starts a background load (a base, or a patch when ``base_version`` is given).
        Raises ``Conflict`` (HTTP 409) when a load is running or the patch's base is not served."""
        with self._lock:
            if self.bg_state == "loading":
                raise Conflict(f"a load of version {self.bg_version} is in progress")
            cur, prev = self._served
            if base_version is not None and (cur is None or cur.version != base_version):
                raise Conflict(f"patch {version} applies to version {base_version}, but the served "
                               f"version is {cur.version if cur else None}")
            # the previous version is kept only until the next load begins
            self._served = (cur, None)
            self._bg_gen += 1
            gen = self._bg_gen
            self.bg, self.bg_state, self.bg_error, self.bg_version = None, "loading", None, version
        threading.Thread(target=self._load, args=(gen, directory, version, base_version, cur),
                         name="cube-load", daemon=True).start()

    def _load(self, gen: int, directory: str, version: int, base_version: int | None, base: _Slot | None):
        t0 = time.perf_counter()
        try:
            d = dictfile.load_shard_dict(directory, verify=self.verify, index=False)
            m = d.meta
            want = (self.dict_name, self.shard, self.shard_num, version)
            got = (m.dict_name, m.shard, m.shard_num, m.version)
            if got != want:
                raise dictfile.DictFormatError(
                    f"{directory}: holds dict {m.dict_name} shard {m.shard}/{m.shard_num} version "
                    f"{m.version}, expected {self.dict_name} shard {self.shard}/{self.shard_num} version {version}")
            entry = {"dir": str(Path(directory).resolve()), "version": version, "mode": m.mode,
                     "base_version": base_version}
            if base_version is None:
                if m.mode != "base":
                    raise dictfile.DictFormatError(f"{directory}: a {m.mode} dict, bg_load_base needs a base")
                slot = _Slot(InlineTable.build(d.keys, d.values), version, [version], [entry])
            else:
                if m.mode != "delta":
                    raise dictfile.DictFormatError(f"{directory}: a {m.mode} dict, bg_load_patch needs a delta")
                if m.base_version not in base.lineage:
                    raise dictfile.DictFormatError(
                        f"{directory}: delta {version} is built on {m.base_version}, which is not part of the "
                        f"served version {base.version} (made of {base.lineage})")
                if m.dim != base.dim:
                    raise dictfile.DictFormatError(f"{directory}: dim {m.dim}, the served version has dim {base.dim}")
                slot = _Slot(base.t.upsert(d.keys, d.values), version, base.lineage + [version],
                             base.chain + [entry])
            del d  # keys/values arrays: the table holds the data
        except Exception as exc:  # reported through /status; the served version is untouched
            with self._lock:
                if gen == self._bg_gen:
                    self.bg_state, self.bg_error = "failed", f"{type(exc).__name__}: {exc}"
                    self.loads["failed"] += 1
            log.error("load of version %s from %s failed: %s", version, directory, exc)
            return
        with self._lock:
            if gen != self._bg_gen:  # unloaded or superseded meanwhile
                return
            self.bg, self.bg_state = slot, "loaded"
            self.loads["ok"] += 1
        log.info("loaded version %d (%d keys, dim %d) from %s in %.2f s", version, len(slot.t), slot.dim,
                 directory, time.perf_counter() - t0)

    def enable(self, version: int) -> dict:
        """Switches to the loaded bg version atomically. Raises ``Conflict``."""
        with self._lock:
            cur, prev = self._served
            if self.bg is None or self.bg_state != "loaded" or self.bg.version != version:
                if cur is not None and cur.version == version:
                    return {"version": version, "changed": False}
                raise Conflict(f"cannot enable {version}: the background slot holds "
                               f"{self.bg_version} ({self.bg_state})")
            self._served = (self.bg, cur)
            self.bg, self.bg_state, self.bg_version, self.bg_error = None, "empty", None, None
            self.enables += 1
            new = self._served[0]
        log.info("enabled version %d (previous %s)", version, cur.version if cur else None)
        self._persist(new)
        return {"version": version, "changed": True, "prev_version": cur.version if cur else None}

    def bg_unload(self) -> None:
        with self._lock:
            self._bg_gen += 1
            self.bg, self.bg_state, self.bg_version, self.bg_error = None, "empty", None, None

    def _persist(self, slot: _Slot) -> None:
        if self.data_dir is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.data_dir / ".state.json.tmp"
        tmp.write_text(json.dumps({"dict_name": self.dict_name, "shard": self.shard,
                                   "shard_num": self.shard_num, "version": slot.version, "chain": slot.chain}))
        os.replace(tmp, self.data_dir / "state.json")

    def _restore(self) -> None:
        """Reloads the chain recorded in ``<data-dir>/state.json`` (synchronously). Starts
        empty (logged) when the file is unreadable or a dict of the chain is not this
        server's ``(dict_name, shard, shard_num)``, e.g. after a restart with a new
        ``--shard-num``."""
        if self.data_dir is None or not (self.data_dir / "state.json").exists():
            return
        try:
            state = json.loads((self.data_dir / "state.json").read_text())
            slot = None
            want = (self.dict_name, self.shard, self.shard_num)
            for e in state["chain"]:
                d = dictfile.load_shard_dict(e["dir"], verify=self.verify, index=False)
                got = (d.meta.dict_name, d.meta.shard, d.meta.shard_num)
                if got != want:
                    raise dictfile.DictFormatError(
                        f"{e['dir']} holds dict {got[0]} shard {got[1]}/{got[2]}, this server is "
                        f"{want[0]} shard {want[1]}/{want[2]} (resized?)")
                if slot is None:
                    slot = _Slot(InlineTable.build(d.keys, d.values), e["version"], [e["version"]], [e])
                else:
                    if d.meta.dim != slot.dim:
                        raise dictfile.DictFormatError(f"{e['dir']}: dim {d.meta.dim}, the chain has dim {slot.dim}")
                    slot = _Slot(slot.t.upsert(d.keys, d.values), e["version"], slot.lineage + [e["version"]],
                                 slot.chain + [e])
                del d
            if slot is not None:
                self._served = (slot, None)
                log.info("restored version %d from %s", slot.version, self.data_dir / "state.json")
        except Exception as exc:
            log.error("cannot restore the state in %s (starting empty): %s", self.data_dir, exc)


class Conflict(Exception):
    """A control request that the current state refuses (HTTP 409)."""


def create_control_app(server: CubeServer):
    """The server's HTTP control app (Flask; routes in the module docstring)."""
    from flask import Flask, Response, jsonify, request
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self):
            st = server.status()
            yield CounterMetricFamily("cube_requests", "seek requests answered", value=st["requests"])
            yield CounterMetricFamily("cube_keys", "keys looked up", value=st["keys_looked_up"])
            yield CounterMetricFamily("cube_hits", "keys found", value=st["hits"])
            e = CounterMetricFamily("cube_errors", "error replies by status", labels=["status"])
            for k, v in st["errors"].items():
                e.add_metric([k], v)
            yield e
            yield GaugeMetricFamily("cube_version", "served version id (0 = none)", value=st["version"] or 0)
            yield GaugeMetricFamily("cube_prev_version", "previous version still answered",
                                    value=st["prev_version"] or 0)
            yield GaugeMetricFamily("cube_dict_keys", "keys in the served version", value=st["keys"])
            yield GaugeMetricFamily("cube_connections", "open data-plane connections", value=st["connections"])
            lo = CounterMetricFamily("cube_loads", "background loads by result", labels=["result"])
            for k, v in server.loads.items():
                lo.add_metric([k], v)
            yield lo
            yield CounterMetricFamily("cube_enables", "version switches", value=server.enables)

    registry = CollectorRegistry()
    registry.register(_Collector())
    ProcessCollector(registry=registry)
    app = Flask("cube-server")

    def body() -> dict:
        data = request.get_json(silent=True) if request.content_length else {}
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        return data

    @app.get("/status")
    def status():
        return jsonify(server.status())

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.post("/bg_load_base")
    def bg_load_base():
        b = body()
        server.bg_load(_req_str(b, "dir"), _req_int(b, "version"))
        return jsonify(accepted=True, version=b["version"]), 202

    @app.post("/bg_load_patch")
    def bg_load_patch():
        b = body()
        server.bg_load(_req_str(b, "dir"), _req_int(b, "version"), _req_int(b, "base_version"))
        return jsonify(accepted=True, version=b["version"]), 202

    @app.post("/enable")
    def enable():
        return jsonify(server.enable(_req_int(body(), "version")))

    @app.post("/bg_unload")
    def bg_unload():
        server.bg_unload()
        return jsonify(ok=True)

    @app.errorhandler(Conflict)
    def conflict(exc):
        return jsonify(error=str(exc)), 409

    @app.errorhandler(ValueError)
    def bad_request(exc):
        return jsonify(error=f"bad request to {request.path}: {exc}"), 400

    @app.errorhandler(404)
    def not_found(_exc):
        return jsonify(error=f"no such path {request.path}"), 404

    @app.errorhandler(405)
    def not_allowed(_exc):
        return jsonify(error=f"{request.method} {request.path}: method not allowed"), 405

    return app


def _req_int(body: dict, key: str) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).isdigit():
        raise ValueError(f"field {key!r} must be a non-negative integer, got {v!r}")
    return int(v)


def _req_str(body: dict, key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise ValueError(f"field {key!r} must be a non-empty string, got {v!r}")
    return v


def main(args) -> int:
    """``elastic-ctr cube server``: serves until SIGTERM/SIGINT, then stops gracefully
    (module docstring: readiness false, ``--drain-seconds``, lookups received are answered
    within ``--stop-timeout``); returns the exit code (0)."""
    from runtime.webserver import StopSignal

    srv = CubeServer(args.shard, args.shard_num, args.dict_name, host=args.host, port=args.port,
                     http_port=args.http_port, data_dir=args.data_dir, max_keys=args.max_keys,
                     verify=not args.no_verify, io_mode=args.io_mode)
    stop = StopSignal()
    srv.start()
    name = stop.wait()
    drain_s, grace_s = float(args.drain_seconds), float(args.stop_timeout)
    log.info("cube server: %s received, stopping (readiness false, draining %.1f s, then up to %.1f s for the "
             "lookups in flight)", name, drain_s, grace_s)
    srv.unready("terminating")
    if drain_s > 0:
        time.sleep(drain_s)
    srv.stop(grace_s=max(grace_s, 0.001))
    log.info("cube server stopped")
    return 0
