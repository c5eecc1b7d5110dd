"""On-disk format of one shard of one cube dict version, and its in-memory form.

A shard directory (``<dict>_part<i>/`` in the builder's output, see docs/contracts.md)::

    meta.json    {"format": 1, "dict_name", "shard", "shard_num", "version", "mode": "base"|"delta",
                  "base_version" (the depend: null for a base), "count", "dim", "capacity",
                  "bytes" (sum of the three data files), "hash": "fmix64-linear",
                  "files": {name: {"bytes", "crc32"}}}
    keys.u64     uint64[count]          little-endian keys (unique; any order)
    values.f32   float32[count, dim]    little-endian values, row i belongs to keys[i]
    index.i32    int32[capacity]        open-addressing hash index: -1 = empty slot, else a row

Every file is a raw little-endian numpy array, so a load is one read (or an mmap) per file
with no parsing. The index: ``capacity`` is a power of two >= 2 * count (load <= 0.5);
a key's home slot is ``fmix64(key) >> (64 - log2(capacity))`` (MurmurHash3's 64-bit
finalizer; keys of one shard share ``key % shard_num``, so their low bits are not
random), collisions by linear probing. Built and probed by ``runtime/cube/kernel.c``.
``ShardDict.lookup`` uses this index; the cube server does not: it builds its inline table
(``runtime/cube/table.py``, key and value in one slot) from ``keys``/``values`` at load
time and keeps only that.

A delta (patch) has the same files holding only the changed and new keys, and names its
base in ``base_version``; the server loads it as an overlay on the served table and
merges it in place later (``runtime/cube/views.py``, ``VersionView``; docs/cube.md).

Validation on load (``load_shard_dict``): every field present and typed, every file's
size equal to what meta says, crc32 of each file (``verify=True``, the default), index
entries within range and exactly ``count`` of them set. The server loads with
``index=False``: the index file's size is checked, but it is not read. Any mismatch raises
``DictFormatError`` naming the directory: a truncated or corrupt dict never gets served.
A patch is loaded by the server with ``load_shard_dict_chunked`` (the same checks, the
values read in chunks, their crc32 checked after the last one).
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from runtime.cube.kernel import KERNEL

FORMAT = 1
HASH = "fmix64-linear"
META, KEYS, VALUES, INDEX = "meta.json", "keys.u64", "values.f32", "index.i32"
MODES = ("base", "delta")


class DictFormatError(ValueError):
    """A shard dict directory is missing, truncated, corrupt or inconsistent; the message
    names the directory and what was wrong."""


def capacity_for(count: int) -> int:
    """Index capacity (slots) for ``count`` keys: the power of two >= 2 * count, at least 16."""
    cap = 16
    while cap < 2 * count + 1:
        cap <<= 1
    return cap


@dataclass
class DictMeta:
    """``meta.json`` of one shard dict (see the module docstring for the fields)."""

    dict_name: str
    shard: int
    shard_num: int
    version: int
    mode: str
    base_version: int | None
    count: int
    dim: int
    capacity: int
    bytes: int = 0
    format: int = FORMAT
    hash: str = HASH
    files: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


@dataclass
class ShardDict:
    """One loaded shard dict version.

    Attributes: ``meta`` (``DictMeta``), ``keys`` uint64[n], ``values`` float32[n, dim],
    ``index`` int32[capacity] (None when loaded with ``index=False``). Treat the arrays as
    read-only."""

    meta: DictMeta
    keys: np.ndarray
    values: np.ndarray
    index: np.ndarray | None

    @property
    def version(self) -> int:
        return self.meta.version

    @property
    def dim(self) -> int:
        return self.meta.dim

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def lookup(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``query: uint64[q]`` -> ``(values float32[q, dim] (zeros for misses), found bool[q])``."""
        query = np.ascontiguousarray(query, dtype=np.uint64)
        out = np.empty((query.shape[0], self.dim), np.float32)
        found = np.empty(query.shape[0], np.uint8)
        KERNEL.lookup(self.index, self.keys, self.values, query, out, found)
        return out, found.view(bool)


def make_shard_dict(keys: np.ndarray, values: np.ndarray, *, dict_name: str, shard: int,
                    shard_num: int, version: int, mode: str = "base",
                    base_version: int | None = None) -> ShardDict:
    """Builds the in-memory dict (and its index) from unique ``keys: uint64[n]`` and
    ``values: float32[n, dim]``. Raises ``ValueError`` on duplicate keys or bad shapes."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise ValueError(f"values must be float32[{keys.shape[0]}, dim], got {values.shape}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cap = capacity_for(keys.shape[0])
    index = KERNEL.build_index(keys, cap)
    meta = DictMeta(dict_name=dict_name, shard=int(shard), shard_num=int(shard_num),
                    version=int(version), mode=mode,
                    base_version=None if base_version is None else int(base_version),
                    count=int(keys.shape[0]), dim=int(values.shape[1]), capacity=cap)
    return ShardDict(meta, keys, values, index)


def _bytes(arr: np.ndarray) -> memoryview:
    """The bytes of ``arr`` (any shape, an empty one included) as a flat memoryview."""
    return memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")


def write_shard_dict(directory: str | os.PathLike, d: ShardDict) -> DictMeta:
    """Writes ``d`` into ``directory`` (created) as the four files; fills and returns its
    meta (``bytes``, per-file ``bytes`` and ``crc32``). ``meta.json`` is written last."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, arr in ((KEYS, d.keys), (VALUES, d.values), (INDEX, d.index)):
        buf = _bytes(arr)
        with open(directory / name, "wb") as f:
            f.write(buf)
        files[name] = {"bytes": buf.nbytes, "crc32": zlib.crc32(buf)}
    d.meta.files = files
    d.meta.bytes = sum(v["bytes"] for v in files.values())
    (directory / META).write_text(d.meta.to_json())
    return d.meta


def read_meta(directory: str | os.PathLike) -> DictMeta:
    """Reads and checks ``meta.json``. Raises ``DictFormatError``."""
    directory = Path(directory)
    path = directory / META
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise DictFormatError(f"{directory}: no {META} (not a cube shard dict directory)") from None
    except (OSError, ValueError) as exc:
        raise DictFormatError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(raw, dict):
        raise DictFormatError(f"{path}: not a JSON object")
    want = {"dict_name": str, "shard": int, "shard_num": int, "version": int, "mode": str,
            "count": int, "dim": int, "capacity": int, "format": int, "hash": str, "files": dict}
    for k, t in want.items():
        if not isinstance(raw.get(k), t):
            raise DictFormatError(f"{path}: field {k!r} missing or not {t.__name__}: {raw.get(k)!r}")
    if raw["format"] != FORMAT or raw["hash"] != HASH:
        raise DictFormatError(f"{path}: format {raw['format']} / hash {raw['hash']!r} unsupported "
                              f"(this build reads format {FORMAT}, hash {HASH!r})")
    if raw["mode"] not in MODES:
        raise DictFormatError(f"{path}: mode {raw['mode']!r} not one of {MODES}")
    if raw["mode"] == "delta" and not isinstance(raw.get("base_version"), int):
        raise DictFormatError(f"{path}: a delta must name its base_version")
    cap, count = raw["capacity"], raw["count"]
    if count < 0 or raw["dim"] <= 0 or cap < 2 * count + 1 or cap & (cap - 1):
        raise DictFormatError(f"{path}: inconsistent count {count} / dim {raw['dim']} / capacity {cap}")
    if not 0 <= raw["shard"] < raw["shard_num"]:
        raise DictFormatError(f"{path}: shard {raw['shard']} out of range for shard_num {raw['shard_num']}")
    fields = {k: raw.get(k) for k in DictMeta.__dataclass_fields__}
    fields["bytes"] = int(raw.get("bytes") or 0)
    return DictMeta(**fields)


def _check_sizes(directory: Path, meta: DictMeta) -> dict[str, tuple[tuple, type]]:
    """The data files' shapes and dtypes; raises ``DictFormatError`` when one is missing or
    its size differs from what ``meta`` says."""
    shapes = {KEYS: ((meta.count,), np.uint64), VALUES: ((meta.count, meta.dim), np.float32),
              INDEX: ((meta.capacity,), np.int32)}
    for name, (shape, dtype) in shapes.items():
        path = directory / name
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DictFormatError(f"{directory}: missing {name}") from None
        if size != want:
            raise DictFormatError(f"{path}: {size} bytes, expected {want} (count {meta.count}, "
                                  f"dim {meta.dim}, capacity {meta.capacity}): truncated or corrupt")
    return shapes


def _check_crc(path: Path, meta: DictMeta, crc: int) -> None:
    rec = meta.files.get(path.name) or {}
    if rec.get("crc32") != crc:
        raise DictFormatError(f"{path}: crc32 {crc} differs from meta's {rec.get('crc32')}: corrupt")


def load_shard_dict_chunked(directory: str | os.PathLike, verify: bool = True,
                            chunk_rows: int = 1 << 16) -> tuple[DictMeta, np.ndarray, Iterator]:
    """Loads a shard dict's meta and keys, and gives its values in chunks, so a reader that
    consumes them one by one (the server's patch load) never holds them all.

    Returns ``(meta, keys uint64[count], chunks)``: ``chunks`` yields ``(first row,
    float32[m, dim])`` with ``m <= chunk_rows``, in row order. Checks as ``load_shard_dict``
    with ``index=False``: file sizes now, the keys' crc32 now, the values' crc32 once the
    last chunk has been read (``chunks`` raises ``DictFormatError`` then: the caller must
    not use what it built from them). Raises ``DictFormatError`` naming the directory."""
    directory = Path(directory)
    meta = read_meta(directory)
    _check_sizes(directory, meta)
    keys = np.fromfile(directory / KEYS, dtype=np.uint64)
    if verify:
        _check_crc(directory / KEYS, meta, zlib.crc32(memoryview(keys).cast("B")))

    def chunks():
        crc = 0
        with open(directory / VALUES, "rb") as f:
            for start in range(0, meta.count, chunk_rows):
                m = min(chunk_rows, meta.count - start)
                vals = np.fromfile(f, dtype=np.float32, count=m * meta.dim).reshape(m, meta.dim)
                if verify:
                    crc = zlib.crc32(memoryview(vals).cast("B"), crc)
                yield start, vals
        if verify:
            _check_crc(directory / VALUES, meta, crc)

    return meta, keys, chunks()


def load_shard_dict(directory: str | os.PathLike, verify: bool = True, mmap: bool = False,
                    index: bool = True) -> ShardDict:
    """Loads and validates a shard dict directory.

    ``verify``: also check each file's crc32 and the index's contents (about 0.1 s per
    1M keys x 10 floats). ``mmap``: map the files read-only instead of reading them into
    private memory (the files must then stay in place while served). ``index=False``: check
    the index file's size but do not read it (``ShardDict.index`` is None; the server builds
    its own table from keys and values).
    Raises ``DictFormatError`` (naming the directory) for anything inconsistent."""
    directory = Path(directory)
    meta = read_meta(directory)
    arrays = {}
    for name, (shape, dtype) in _check_sizes(directory, meta).items():
        path = directory / name
        if name == INDEX and not index:
            continue
        if mmap and int(np.prod(shape)):
            arr = np.memmap(path, dtype=dtype, mode="r", shape=shape)
        else:
            arr = np.fromfile(path, dtype=dtype).reshape(shape)
        if verify:
            _check_crc(path, meta, zlib.crc32(_bytes(arr)))
        arrays[name] = arr
    idx = arrays.get(INDEX)
    if verify and idx is not None:
        used = idx >= 0
        n_used = int(np.count_nonzero(used))
        if n_used != meta.count or (n_used and int(idx.max()) >= meta.count):
            raise DictFormatError(f"{directory}: index holds {n_used} entries (max row "
                                  f"{int(idx.max()) if n_used else -1}) for {meta.count} keys: corrupt")
    return ShardDict(meta, arrays[KEYS], arrays[VALUES], idx)
