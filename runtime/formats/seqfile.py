"""Hadoop SequenceFile reader for the sparse table (key = feasign, value = embedding), and the format it shares with the writer.

Format (Hadoop ``org.apache.hadoop.io.SequenceFile``, version 6, uncompressed):

* header: ``b"SEQ"``, version byte ``6``; key and value class names, each a Hadoop
  ``Text`` (VInt length, UTF-8 bytes); ``compress`` and ``blockCompress`` booleans (one
  byte each); metadata (big-endian int32 count, then count pairs of ``Text``); a 16-byte
  sync marker.
* record: big-endian int32 record length (key + value bytes), big-endian int32 key
  length, key bytes, value bytes.
* sync escape: big-endian int32 ``-1`` followed by the 16-byte sync marker, written
  between records once at least ``sync_interval`` bytes (2000 in Hadoop and in Paddle
  Serving's kvtool) have passed since the last one.

Record styles read (chosen from the first record, then required of every record):

* ``raw``: what Paddle Serving's cube tools (kvtool) write under the class name
  ``org.apache.hadoop.io.BytesWritable``: key = the uint64 in little-endian byte order
  (8 bytes), value = the float32 values, little-endian, with no inner length.
* ``bytes_writable``: a real Hadoop ``BytesWritable`` key and value: a big-endian int32
  length, then the same payload bytes as ``raw``.
* ``long_writable``: key class ``org.apache.hadoop.io.LongWritable`` (big-endian int64),
  value raw or ``BytesWritable``-framed.

``raw`` is what this project writes by default (the trainer's export); both common
styles are written on request (``runtime.formats.seqfile_writer``). Reading is vectorized: the bytes between two sync escapes
are a run of fixed-size records, parsed by one ``numpy.frombuffer`` per chunk, so a file
of any size streams in bounded memory (``chunk_bytes``).

Errors: ``SequenceFileError`` (a ``ValueError``) names the file and the byte offset of
the first bad byte (bad magic, unsupported version or compression, a record whose
lengths differ from the first record's, a truncated record or sync marker).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np

BYTES_WRITABLE = "org.apache.hadoop.io.BytesWritable"
LONG_WRITABLE = "org.apache.hadoop.io.LongWritable"
SYNC_ESCAPE = b"\xff\xff\xff\xff"
SYNC_SIZE = 16
DEFAULT_SYNC_INTERVAL = 2000  # bytes; Hadoop's SYNC_INTERVAL (100 * (4 + 16)) and kvtool's
DEFAULT_CHUNK_BYTES = 64 << 20
STYLES = ("raw", "bytes_writable", "long_writable")


class SequenceFileError(ValueError):
    """A SequenceFile is malformed. ``path`` and ``offset`` (bytes from the file start)
    name where; the message says what was wrong."""

    def __init__(self, path: str, offset: int, what: str):
        self.path, self.offset = str(path), int(offset)
        super().__init__(f"{path}: at byte offset {offset}: {what}")


@dataclass(frozen=True)
class Header:
    """Parsed SequenceFile header. ``size`` is its length in bytes (records start there)."""

    key_class: str
    value_class: str
    metadata: dict
    sync: bytes
    size: int


def record_dtype(style: str, dim: int) -> np.dtype:
    """Packed numpy dtype of one record (lengths included) for ``style`` and ``dim``."""
    if style == "raw":
        fields = [("rlen", ">i4"), ("klen", ">i4"), ("key", "<u8"), ("val", "<f4", (dim,))]
    elif style == "bytes_writable":
        fields = [("rlen", ">i4"), ("klen", ">i4"), ("kin", ">i4"), ("key", "<u8"),
                  ("vin", ">i4"), ("val", "<f4", (dim,))]
    elif style == "long_writable":
        fields = [("rlen", ">i4"), ("klen", ">i4"), ("key", ">u8"), ("val", "<f4", (dim,))]
    elif style == "long_writable_bw":
        fields = [("rlen", ">i4"), ("klen", ">i4"), ("key", ">u8"), ("vin", ">i4"),
                  ("val", "<f4", (dim,))]
    else:
        raise ValueError(f"record style {style!r}: expected one of {STYLES}")
    return np.dtype(fields)


def _read_vint(buf: bytes, pos: int) -> tuple[int, int]:
    """Hadoop ``WritableUtils.readVInt``: returns (value, new position)."""
    first = struct.unpack_from("b", buf, pos)[0]
    if first >= -112:
        return first, pos + 1
    neg = first < -120
    length = (-119 - first) if neg else (-111 - first)
    val = 0
    for i in range(1, length):
        val = (val << 8) | buf[pos + i]
    return (~val if neg else val), pos + length


class SequenceFileReader:
    """Streams (keys, values) batches out of one SequenceFile (path or URL).

    Attributes after opening: ``header`` (``Header``), ``style`` (record style),
    ``dim`` (floats per value; 0 for an empty file). Use as a context manager or call
    ``close()``.

    ``expect_rows``: the records the file must hold (its manifest's ``rows``,
    ``runtime.formats.manifest``); a file that ends cleanly after another count (e.g. cut
    exactly between two records) raises ``SequenceFileError`` at its end. None: not checked.

    Raises ``SequenceFileError`` naming the file and byte offset for any malformed byte,
    ``runtime.storage.LocationError`` if the location cannot be opened.
    """

    def __init__(self, location: str | os.PathLike | BinaryIO, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 name: str | None = None, expect_rows: int | None = None):
        self.expect_rows = None if expect_rows is None else int(expect_rows)
        self.rows = 0  # records yielded so far
        if hasattr(location, "read"):
            self._f: BinaryIO = location  # type: ignore[assignment]
            self.name = name or getattr(location, "name", "<stream>")
        else:
            from runtime.storage import open_stream

            self.name = name or str(location)
            self._f = open_stream(str(location))
        self.chunk_bytes = max(int(chunk_bytes), 1 << 16)
        self._buf = b""
        self._base = 0  # file offset of self._buf[0]
        self._eof = False
        self.header = self._read_header()
        self.style, self.dim = self._detect_style()

    # -- low-level buffering -------------------------------------------------------
    def _fill(self, need: int) -> bool:
        """Reads until at least ``need`` bytes are buffered; False if EOF came first."""
        while len(self._buf) < need and not self._eof:
            chunk = self._f.read(self.chunk_bytes)
            if not chunk:
                self._eof = True
                break
            self._buf += chunk
        return len(self._buf) >= need

    def _consume(self, n: int) -> None:
        self._buf = self._buf[n:]
        self._base += n

    def _err(self, rel: int, what: str) -> SequenceFileError:
        return SequenceFileError(self.name, self._base + rel, what)

    # -- header ---------------------------------------------------------------------
    def _read_header(self) -> Header:
        self._fill(4096)
        b = self._buf
        if len(b) < 4 or b[:3] != b"SEQ":
            raise self._err(0, "not a SequenceFile (missing 'SEQ' magic)")
        if b[3] != 6:
            raise self._err(3, f"unsupported SequenceFile version {b[3]} (expected 6)")
        try:
            pos = 4
            names = []
            for _ in range(2):
                n, pos = _read_vint(b, pos)
                if n < 0 or pos + n > len(b):
                    raise IndexError
                names.append(b[pos: pos + n].decode())
                pos += n
            compress, block = b[pos], b[pos + 1]
            pos += 2
            if compress or block:
                raise self._err(pos - 2, "compressed SequenceFiles are not supported")
            (count,) = struct.unpack_from(">i", b, pos)
            pos += 4
            meta = {}
            for _ in range(count):
                kv = []
                for _ in range(2):
                    n, pos = _read_vint(b, pos)
                    kv.append(b[pos: pos + n].decode("utf-8", "replace"))
                    pos += n
                meta[kv[0]] = kv[1]
            sync = b[pos: pos + SYNC_SIZE]
            if len(sync) != SYNC_SIZE:
                raise IndexError
            pos += SYNC_SIZE
        except (IndexError, struct.error, UnicodeDecodeError):
            raise self._err(len(b), "truncated or corrupt header") from None
        self._consume(pos)
        return Header(names[0], names[1], meta, sync, pos)

    def _detect_style(self) -> tuple[str, int]:
        """Reads the first record's lengths to choose the record style and dim."""
        while True:
            if not self._fill(8):
                if self._buf:
                    raise self._err(0, "truncated record header")
                return "raw", 0  # no records
            rlen, klen = struct.unpack_from(">ii", self._buf, 0)
            if rlen == -1:  # a sync escape before the first record
                self._check_sync(0)
                self._consume(4 + SYNC_SIZE)
                continue
            break
        if not self._fill(8 + rlen):
            raise self._err(0, f"truncated record: needs {rlen} bytes after its lengths")
        vlen = rlen - klen
        key = self._buf[8: 8 + klen]
        if self.header.key_class == LONG_WRITABLE:
            if klen != 8:
                raise self._err(4, f"LongWritable key of {klen} bytes (expected 8)")
            inner = struct.unpack_from(">i", self._buf, 8 + klen)[0] if vlen >= 4 else -1
            if inner == vlen - 4 and (vlen - 4) % 4 == 0:
                return "long_writable_bw", (vlen - 4) // 4
            style = "long_writable"
        elif klen == 8:
            style = "raw"
        elif klen == 12 and struct.unpack_from(">i", key, 0)[0] == 8:
            style = "bytes_writable"
            vlen -= 4
        else:
            raise self._err(4, f"key of {klen} bytes: expected an 8-byte uint64 (raw) or a "
                               f"BytesWritable of 8 bytes")
        if vlen <= 0 or vlen % 4:
            raise self._err(0, f"value of {vlen} bytes is not a float32 vector")
        return style, vlen // 4

    def _check_sync(self, rel: int) -> None:
        if not self._fill(rel + 4 + SYNC_SIZE):
            raise self._err(rel, "truncated sync marker")
        if self._buf[rel + 4: rel + 4 + SYNC_SIZE] != self.header.sync:
            raise self._err(rel + 4, "sync marker does not match the header's")

    # -- records --------------------------------------------------------------------
    def iter_batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields ``(keys uint64[m], values float32[m, dim])`` per chunk read, in file order;
        at the end, checks ``expect_rows`` (class docstring)."""
        for keys, values in self._batches():
            self.rows += len(keys)
            if self.expect_rows is not None and self.rows > self.expect_rows:
                raise self._err(0, f"more records than the {self.expect_rows} expected")
            yield keys, values
        if self.expect_rows is not None and self.rows != self.expect_rows:
            raise SequenceFileError(self.name, self._base, f"ends after {self.rows} records, "
                                    f"{self.expect_rows} expected (a file cut between two records?)")

    def _batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self.dim == 0:
            return
        dt = record_dtype(self.style, self.dim)
        size = dt.itemsize
        marker = SYNC_ESCAPE + self.header.sync
        hold = size + len(marker)  # kept back at a chunk's end unless at EOF
        while True:
            self._fill(self.chunk_bytes)
            buf, end = self._buf, len(self._buf)
            limit = end if self._eof else max(0, end - hold)
            spans, p, total = [], 0, 0  # (start, length) of each run of whole records
            while p < limit:
                q = buf.find(marker, p, limit + len(marker))
                stop = limit if q < 0 else q
                whole = (stop - p) // size * size
                if q >= 0 and whole != stop - p:
                    raise self._err(p + whole, f"record lengths do not add up before the sync "
                                               f"marker at offset {self._base + q}")
                if whole:
                    spans.append((p, whole))
                    total += whole
                if q < 0:
                    p += whole
                    break
                p = q + len(marker)
            if self._eof and p < end:
                if buf[p: p + 4] == SYNC_ESCAPE:
                    raise self._err(p, "truncated or corrupt sync marker")
                raise self._err(p, f"truncated record ({end - p} bytes left, record is {size})")
            if spans:
                data = bytearray(total)
                src, out, o = memoryview(buf), memoryview(data), 0
                for start, length in spans:
                    out[o: o + length] = src[start: start + length]
                    o += length
                rec = np.frombuffer(data, dtype=dt)
                self._validate(rec, dt)
                yield (np.ascontiguousarray(rec["key"], dtype=np.uint64),
                       np.ascontiguousarray(rec["val"], dtype=np.float32))
            self._consume(p)
            if self._eof and not self._buf:
                return
            if not spans and p == 0 and self._eof:
                return

    def _validate(self, rec: np.ndarray, dt: np.dtype) -> None:
        """Checks every record's lengths equal the first record's; names the first bad one."""
        ok = (rec["rlen"] == dt.itemsize - 8) & (rec["klen"] == (12 if self.style == "bytes_writable" else 8))
        if "vin" in dt.names:
            ok &= rec["vin"] == 4 * self.dim
        if "kin" in dt.names:
            ok &= rec["kin"] == 8
        if not ok.all():
            i = int(np.argmin(ok))
            raise SequenceFileError(self.name, self._locate(i, dt.itemsize),
                                    f"record {i} of this chunk has lengths that differ from the "
                                    f"first record's (rlen {int(rec['rlen'][i])}, klen {int(rec['klen'][i])})")

    def _locate(self, index: int, size: int) -> int:
        """File offset of the ``index``-th record of the current chunk (skipping sync escapes)."""
        marker = SYNC_ESCAPE + self.header.sync
        buf, p, seen = self._buf, 0, 0
        while True:
            q = buf.find(marker, p)
            n = ((q if q >= 0 else len(buf)) - p) // size
            if index < seen + n or q < 0:
                return self._base + p + (index - seen) * size
            seen += n
            p = q + len(marker)

    def close(self) -> None:
        """Closes the underlying stream."""
        self._f.close()

    def __enter__(self) -> "SequenceFileReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_sequence_file(location: str | os.PathLike, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                       expect_rows: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Streams ``(keys uint64[m], values float32[m, dim])`` batches of one SequenceFile
    (path or URL), about ``chunk_bytes`` of records each; ``expect_rows`` as
    ``SequenceFileReader``. Errors as ``SequenceFileReader``."""
    with SequenceFileReader(location, chunk_bytes=chunk_bytes, expect_rows=expect_rows) as r:
        yield from r.iter_batches()


def read_sequence_file(location: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Reads a whole SequenceFile: ``(keys uint64[n], values float32[n, dim])``.

    An empty file gives ``uint64[0]`` and ``float32[0, 0]``. Errors as ``SequenceFileReader``.
    """
    with SequenceFileReader(location) as r:
        batches = list(r.iter_batches())
        dim = r.dim
    if not batches:
        return np.empty(0, np.uint64), np.empty((0, dim), np.float32)
    return (np.concatenate([k for k, _ in batches]),
            np.concatenate([v for _, v in batches]).reshape(-1, dim))
