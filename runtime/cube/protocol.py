"""The cube data plane's wire protocol: length-prefixed binary frames over TCP.

All integers little-endian. A connection carries any number of request/reply pairs, in
order (keep-alive; a client may pipeline). Frame = ``u32 length`` (bytes that follow,
header included) + body.

Request body (``REQ_HEADER``, 28 bytes after the length, so keys start 8-byte aligned
at byte 32 of the frame)::

    u32 magic      0x45425543 (b"CUBE")
    u8  op         1 = SEEK
    u8  flags      bit 0: ``version`` is set (answer from that version or refuse)
    u16 reserved   0
    u32 request_id echoed in the reply
    u32 count      number of keys
    u32 reserved   0
    u64 version    wanted version id (when flags bit 0)
    u64 keys[count]

Reply body (``REP_HEADER``, 36 bytes after the length)::

    u32 magic      0x45425543
    u8  status     STATUS_* below
    u8  flags      0
    u16 reserved
    u32 request_id
    u32 count      keys answered (0 on an error)
    u32 dim        floats per value
    u64 version    version answered from (on an error: the version currently served, 0 = none)
    u64 other      the other version held (the previous one), 0 = none
    then, when status == OK:
        u8  found[count]         1 = hit, 0 = miss; then padding to a multiple of 8 bytes
                                 (its content is unspecified: readers skip it)
        f32 values[count * dim]  zeros for a miss
    else: a UTF-8 error message (the rest of the frame)

Errors: ``VERSION_UNAVAILABLE`` (the wanted version is neither the current nor the
previous one: ``version``/``other`` say what is held), ``NOT_READY`` (nothing loaded yet),
``BAD_REQUEST`` (bad magic, op, or a length that disagrees with count) and
``TOO_LARGE`` (length above the server's limit, default 1 Mi keys). After BAD_REQUEST
or TOO_LARGE the server closes the connection (the stream can no longer be trusted);
other connections are unaffected.

This module owns the format. The cube client's C request path
(``runtime/cube/kernel.c``: ``cube_client_seek``) writes requests and reads replies by the
same layout; ``tests/cube/test_client.py`` checks its answers against the Python path's.
"""
from __future__ import annotations

import struct

import numpy as np

MAGIC = 0x45425543  # b"CUBE" little-endian
OP_SEEK = 1
FLAG_VERSION = 1  # request flags bit 0: the ``version`` field is set

LEN = struct.Struct("<I")
REQ_HEADER = struct.Struct("<IBBHIIIQ")   # magic, op, flags, rsv, request_id, count, rsv, version
REP_HEADER = struct.Struct("<IBBHIIIQQ")  # magic, status, flags, rsv, request_id, count, dim, version, other
REP_FRAME = struct.Struct("<IIBBHIIIQQ")  # length + REP_HEADER, packed in one call by the server (OK replies)
REQ_PREFIX = LEN.size + REQ_HEADER.size   # 32: offset of the keys in a request frame
REP_PREFIX = LEN.size + REP_HEADER.size   # 40: offset of the found mask in a reply frame

OK = 0
VERSION_UNAVAILABLE = 1
NOT_READY = 2
BAD_REQUEST = 3
TOO_LARGE = 4
SERVER_ERROR = 5
STATUS_NAMES = {OK: "OK", VERSION_UNAVAILABLE: "VERSION_UNAVAILABLE", NOT_READY: "NOT_READY",
                BAD_REQUEST: "BAD_REQUEST", TOO_LARGE: "TOO_LARGE", SERVER_ERROR: "SERVER_ERROR"}

DEFAULT_MAX_KEYS = 1 << 20
MAX_ERROR_MESSAGE = 4096  # bytes of an error reply's message at most (``encode_error`` cuts it)


def request_size(count: int) -> int:
    """Bytes of a request frame (length prefix included) for ``count`` keys; its length
    field holds ``request_size(count) - LEN.size``."""
    return REQ_PREFIX + 8 * count


def reply_layout(count: int, dim: int) -> tuple[int, int]:
    """An OK reply for ``count`` keys of ``dim`` floats -> ``(values_offset, frame_size)``,
    bytes from the start of the frame (length prefix included): the found mask
    ``u8[count]`` starts at ``REP_PREFIX``, padded to a multiple of 8 bytes, the
    values ``f32[count * dim]`` at ``values_offset``, and the frame ends at
    ``frame_size``. The server writes replies and ``decode_reply`` reads them by this
    layout (the one place the padding is computed)."""
    at = REP_PREFIX + ((count + 7) & ~7)
    return at, at + 4 * count * dim


def reply_size(count: int, dim: int) -> int:
    """Bytes of an OK reply frame (length prefix included) for ``count`` keys of ``dim`` floats."""
    return reply_layout(count, dim)[1]


def encode_request(keys: np.ndarray, version: int | None = None, request_id: int = 0) -> bytes:
    """``keys: uint64[n]`` -> one request frame (bytes); ``version`` set (not None/0) sets
    ``FLAG_VERSION`` (answer from that version or refuse)."""
    keys = np.ascontiguousarray(keys, dtype="<u8")
    n = keys.shape[0]
    head = LEN.pack(request_size(n) - LEN.size) + REQ_HEADER.pack(
        MAGIC, OP_SEEK, FLAG_VERSION if version else 0, 0, request_id & 0xFFFFFFFF, n, 0,
        int(version or 0))
    return head + keys.tobytes()


def encode_error(status: int, request_id: int, version: int, other: int, message: str) -> bytes:
    """An error reply frame (``status`` != OK) carrying ``message``."""
    msg = message.encode("utf-8", "replace")[:MAX_ERROR_MESSAGE]
    return LEN.pack(REP_HEADER.size + len(msg)) + REP_HEADER.pack(
        MAGIC, status, 0, 0, request_id & 0xFFFFFFFF, 0, 0, version, other) + msg


class ReplyError(Exception):
    """A reply with status != OK. ``status``, ``version`` (served), ``other`` (previous)."""

    def __init__(self, status: int, version: int, other: int, message: str):
        self.status, self.version, self.other = status, version, other
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {message}")


def decode_reply(frame: memoryview | bytes) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """A whole reply frame (length prefix included) -> ``(request_id, version, other,
    found bool[count], values float32[count, dim])`` (views into ``frame``).

    Raises ``ReplyError`` for a status other than OK, ``ValueError`` for a malformed frame."""
    (length,) = LEN.unpack_from(frame, 0)
    magic, status, _, _, rid, count, dim, version, other = REP_HEADER.unpack_from(frame, 4)
    if magic != MAGIC or length + 4 != len(frame):
        raise ValueError(f"malformed reply (magic {magic:#x}, length {length}, frame {len(frame)})")
    if status != OK:
        raise ReplyError(status, version, other, bytes(frame[REP_PREFIX:]).decode("utf-8", "replace"))
    values_at, size = reply_layout(count, dim)
    if len(frame) != size:
        raise ValueError(f"reply of {len(frame)} bytes for {count} keys x dim {dim}")
    found = np.frombuffer(frame, np.bool_, count, REP_PREFIX)
    values = np.frombuffer(frame, np.float32, count * dim, values_at).reshape(count, dim)
    return rid, version, other, found, values
