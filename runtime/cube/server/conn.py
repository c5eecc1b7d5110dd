"""The cube server's data-plane connections: their buffers and counters, and ``answerer``, the hot path that answers their lookup requests.

``LookupServer`` (``runtime/cube/server/lookups.py``) owns the sockets and the I/O loops;
what one connection holds (``Conn``: its request and reply buffers, ``ConnStats``) and how
a complete request frame becomes a reply (one C call per request, ``kernel.c``
``cube_view_lookup``, GIL released) are here.
"""
from __future__ import annotations

import ctypes
import socket

from runtime.cube import protocol
from runtime.cube.kernel import KERNEL
from runtime.cube.server.sockets import has_unread, unacked


class ConnStats:
    """Counters of one connection: ``requests`` answered OK, ``keys`` looked up, ``hits``
    (keys found), ``errors`` (error replies by protocol status)."""

    __slots__ = ("requests", "keys", "hits", "errors")

    def __init__(self):
        self.requests = self.keys = self.hits = 0
        self.errors: dict[int, int] = {}


class Buf:
    """A bytearray of ``size`` bytes with its address (``addr``, for the C kernel) and a
    memoryview (``mv``)."""

    __slots__ = ("b", "mv", "addr", "_c")

    def __init__(self, size: int):
        self.b = bytearray(size)
        self.mv = memoryview(self.b)
        self._c = (ctypes.c_char * size).from_buffer(self.b)
        self.addr = ctypes.addressof(self._c)


class Conn:
    """A data-plane connection's state: request buffer ``rin`` (``have`` bytes used),
    reply buffer ``rout``, stats ``st``, and its send function ``send(bytes-like)``."""

    __slots__ = ("sock", "st", "send", "rin", "rout", "have")

    def __init__(self, sock, st: ConnStats, send):
        self.sock, self.st, self.send = sock, st, send
        self.rin = Buf(protocol.request_size(1024))
        self.rout = Buf(protocol.reply_size(1024, 16))
        self.have = 0


def idle(sock: socket.socket, c: Conn) -> bool:
    """A connection a stopping server may close without losing anything: no partial
    request held, nothing unread, and every reply byte acknowledged by the client (closing
    with unread bytes, or one arriving on a closed socket, resets the connection, and a
    reset drops what is still queued)."""
    return c.have == 0 and not has_unread(sock) and unacked(sock) == 0


def answerer(plane):
    """The hot path of ``plane`` (a ``LookupServer``): returns ``answer(c: Conn) -> bool``,
    which answers every complete request frame in ``c.rin`` (False: close the connection). The protocol's
    sizes, layout and flags (``runtime/cube/protocol.py``) and the kernel entry are bound
    once here, so a request pays local lookups only."""
    P = protocol
    unpack_len, unpack_req, pack_rep = P.LEN.unpack_from, P.REQ_HEADER.unpack_from, P.REP_FRAME.pack_into
    request_size, reply_layout = P.request_size, P.reply_layout
    MAGIC, OP_SEEK, FLAG_VERSION, OK = P.MAGIC, P.OP_SEEK, P.FLAG_VERSION, P.OK
    NOT_READY, VERSION_UNAVAILABLE, SERVER_ERROR = P.NOT_READY, P.VERSION_UNAVAILABLE, P.SERVER_ERROR
    REQ_PREFIX, REP_PREFIX, hdr = P.REQ_PREFIX, P.REP_PREFIX, P.REQ_HEADER.size
    lookup_raw = KERNEL.view_lookup_raw
    versions, error = plane.versions, plane._error
    max_frame, max_keys = plane.max_frame, plane.max_keys

    def answer(c: Conn) -> bool:
        st = c.st
        while c.have >= 4:
            rin = c.rin
            (length,) = unpack_len(rin.b, 0)
            if length > max_frame:
                error(c, P.TOO_LARGE, 0, f"frame of {length} bytes exceeds the limit of "
                                         f"{max_frame} ({max_keys} keys)")
                return False
            if length < hdr:
                error(c, P.BAD_REQUEST, 0, f"frame of {length} bytes is shorter than the header")
                return False
            total = length + 4
            if total > len(rin.b):
                nb = Buf(total)
                nb.b[:c.have] = rin.mv[:c.have]
                c.rin = nb
                return True  # read the rest first
            if c.have < total:
                return True
            magic, op, flags, _, rid, count, _, want = unpack_req(rin.b, 4)
            if magic != MAGIC or op != OP_SEEK or total != request_size(count):
                error(c, P.BAD_REQUEST, rid,
                      f"bad request (magic {magic:#x}, op {op}, length {length}, count {count})")
                return False
            hits = -1
            while hits == -1:  # the view was retired since `served` was read: read it again
                cur, prev = versions.served
                slot = cur
                if cur is None:
                    slot = None
                    status = NOT_READY
                elif flags & FLAG_VERSION and want != cur.version:
                    slot = prev if prev is not None and prev.version == want else None
                    status = VERSION_UNAVAILABLE
                if slot is None:
                    error(c, status, rid,
                          "no version loaded" if status == NOT_READY else
                          f"version {want} not held (serving {cur.version}, previous "
                          f"{prev.version if prev else None})", close=False)
                    break
                dim = slot.dim
                values_at, size = reply_layout(count, dim)
                rout = c.rout
                if size > len(rout.b):
                    rout = c.rout = Buf(size)
                addr = rout.addr
                hits = lookup_raw(slot.addr, rin.addr + REQ_PREFIX, count, addr + values_at, addr + REP_PREFIX)
            if hits < -1:  # the kernel refused the view (more tables than it reads): never built so
                error(c, SERVER_ERROR, rid, f"version {slot.version}: view refused by the kernel ({hits})",
                      close=False)
            elif hits >= 0:
                pack_rep(rout.b, 0, size - 4, MAGIC, OK, 0, 0, rid, count, dim, slot.version,
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

    return answer
