"""The Hadoop SequenceFile writer for the sparse table: ``write_sequence_file`` (key = feasign, value = embedding).

The format and the record styles are ``runtime.formats.seqfile``'s (which reads them);
this module writes them: a header, then the records in chunks, a sync escape every
``sync_interval`` bytes, to a temporary file renamed into place.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from runtime.formats.seqfile import (BYTES_WRITABLE, DEFAULT_SYNC_INTERVAL, LONG_WRITABLE, STYLES, SYNC_ESCAPE,
                                     SYNC_SIZE, record_dtype)


def _text(s: str) -> bytes:
    """Hadoop ``Text`` serialization (VInt length + UTF-8) for strings shorter than 128 bytes."""
    b = s.encode()
    if len(b) > 127:
        raise ValueError(f"class name too long for a one-byte VInt: {s!r}")
    return bytes([len(b)]) + b


def write_sequence_file(
    path: str | os.PathLike,
    keys: np.ndarray,
    values: np.ndarray,
    style: str = "raw",
    sync_interval: int = DEFAULT_SYNC_INTERVAL,
    sync: bytes | None = None,
) -> int:
    """Writes ``keys: uint64[n]`` and ``values: float32[n, dim]`` as one SequenceFile.

    ``style`` is ``"raw"`` (kvtool's records, the default), ``"bytes_writable"`` or
    ``"long_writable"`` (see the module docstring). A sync escape follows every block of
    ``ceil(sync_interval / record_bytes)`` records. The file is written to a temporary
    name beside ``path`` and renamed, so no reader sees it half-written.

    Returns the number of bytes written. Raises ``ValueError`` on mismatched shapes.
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise ValueError(f"values must be float32[n, dim] with n = len(keys) = {keys.shape[0]}, "
                         f"got shape {values.shape}")
    n, dim = values.shape
    if style not in STYLES:
        raise ValueError(f"record style {style!r}: expected one of {STYLES}")
    sync = sync if sync is not None else os.urandom(SYNC_SIZE)
    if len(sync) != SYNC_SIZE:
        raise ValueError("sync marker must be 16 bytes")
    key_class = LONG_WRITABLE if style == "long_writable" else BYTES_WRITABLE
    header = (b"SEQ\x06" + _text(key_class) + _text(BYTES_WRITABLE) + b"\x00\x00"
              + struct.pack(">i", 0) + sync)

    dt = record_dtype(style, dim)
    rec = np.empty(n, dtype=dt)
    if style == "bytes_writable":
        rec["klen"], rec["kin"], rec["vin"] = 12, 8, 4 * dim
    else:
        rec["klen"] = 8
    rec["rlen"] = dt.itemsize - 8
    rec["key"] = keys
    rec["val"] = values
    raw = rec.view(np.uint8).reshape(n, dt.itemsize)

    per_block = max(1, -(-sync_interval // dt.itemsize))
    n_full = n // per_block
    escape = np.frombuffer(SYNC_ESCAPE + sync, dtype=np.uint8)
    blocks = np.empty((n_full, per_block * dt.itemsize + len(escape)), dtype=np.uint8)
    blocks[:, : per_block * dt.itemsize] = raw[: n_full * per_block].reshape(n_full, per_block * dt.itemsize)
    blocks[:, per_block * dt.itemsize:] = escape
    body = blocks.reshape(-1)
    rest = raw[n_full * per_block:].reshape(-1)
    if rest.size == 0 and n_full:
        body = body[: -len(escape)]  # no sync escape after the last record

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(memoryview(body))
            f.write(memoryview(rest))
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    return len(header) + body.size + rest.size
