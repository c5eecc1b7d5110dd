"""Hot loops of the cube data plane, compiled: hash index build and batch lookup.

Two backends with one interface (``KERNEL.build_index``, ``KERNEL.lookup``,
``KERNEL.lookup_raw`` where available):

- ``c`` (default): ``_kernel.c`` compiled on first use with the system C compiler
  (``cc -O3 -shared -fPIC``) into ``$ELASTIC_CTR_KERNEL_DIR`` (default
  ``~/.cache/elastic-ctr``, else the temp dir), named by the source's hash, and called
  through ctypes (which releases the GIL). Chosen over numba for the server because a
  process that imports numba holds ~145 MiB RSS before any data (numba + llvmlite,
  measured here), which alone breaks the memory target (1.6 x raw bytes + 60 MiB); the
  C kernel adds < 1 MiB. Prebuild it in an image with ``python -m runtime.cube._kernel``.
- ``numba``: the same algorithms jitted (``cache=True``), used when no C compiler is
  found, or with ``ELASTIC_CTR_CUBE_KERNEL=numba``.

Index layout and hash: see ``_kernel.c`` and ``runtime/cube/dictfile.py``.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("_kernel.c")


class KernelError(RuntimeError):
    """The compiled kernel could not be built or loaded."""


def _cache_dir() -> Path:
    env = os.environ.get("ELASTIC_CTR_KERNEL_DIR")
    if env:
        return Path(env)
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return home / "elastic-ctr"


def _compile() -> Path:
    """Compiles ``_kernel.c`` (once per source hash) and returns the shared library's path.

    Raises ``KernelError`` when no compiler is found or compilation fails."""
    src = _SRC.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    for d in (_cache_dir(), Path(tempfile.gettempdir()) / f"elastic-ctr-{os.getuid()}"):
        so = d / f"cube_kernel_{digest}.so"
        if so.exists():
            return so
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise KernelError("no C compiler (cc, gcc, clang) on PATH")
    last_err = None
    for d in (_cache_dir(), Path(tempfile.gettempdir()) / f"elastic-ctr-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            so = d / f"cube_kernel_{digest}.so"
            tmp = d / f".cube_kernel_{digest}.{os.getpid()}.so"
            proc = subprocess.run(
                [cc, "-O3", "-shared", "-fPIC", "-o", str(tmp), str(_SRC)],
                capture_output=True, text=True, timeout=120,
            )
            if proc.returncode != 0:
                raise KernelError(f"{cc} failed on {_SRC}: {proc.stderr.strip()}")
            os.replace(tmp, so)  # atomic: concurrent first uses race harmlessly
            return so
        except OSError as exc:
            last_err = exc
    raise KernelError(f"cannot write the compiled kernel: {last_err}")


class _CKernel:
    """ctypes binding of ``_kernel.c``."""

    name = "c"

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(_compile()))
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.cube_build_index.argtypes = [vp, i64, vp, i64]
        lib.cube_build_index.restype = i64
        lib.cube_lookup.argtypes = [vp, i64, vp, vp, i64, vp, i64, vp, vp, vp]
        lib.cube_lookup.restype = i64
        self._build = lib.cube_build_index
        u64 = ctypes.c_uint64
        lib.cube_build_table.argtypes = [vp, i64, i64, u64, vp, vp, i64, i64]
        lib.cube_build_table.restype = i64
        lib.cube_table_clear.argtypes = [vp, i64, i64, u64]
        lib.cube_table_clear.restype = None
        lib.cube_table_insert.argtypes = [vp, i64, i64, u64, i64, vp, vp, i64, i64, ctypes.c_int]
        lib.cube_table_insert.restype = i64
        lib.cube_table_rehash.argtypes = [vp, i64, u64, vp, i64, u64, i64]
        lib.cube_table_rehash.restype = i64
        lib.cube_table_lookup.argtypes = [vp, i64, i64, u64, i64, vp, i64, vp, vp]
        lib.cube_table_lookup.restype = i64
        self._lib = lib
        #: raw entry of the inline table's lookup: (table_addr, cap, stride_bytes, sentinel,
        #: dim, q_addr, qn, out_addr or None, found_addr) -> hits; addresses are ints (no
        #: checks: callers own the buffers' sizes). Used by the server's hot path.
        self.table_lookup_raw = lib.cube_table_lookup
        #: raw entry: (index_addr, cap, keys_addr, values_addr, dim, q_addr, qn, out_addr,
        #: found_addr, rows_addr or None) -> hits; addresses are ints (no checks: callers
        #: own the buffers' sizes). Used by the server's hot path.
        self.lookup_raw = lib.cube_lookup

    def build_index(self, keys: np.ndarray, cap: int) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        index = np.empty(cap, dtype=np.int32)
        rc = self._build(keys.ctypes.data, keys.shape[0], index.ctypes.data, cap)
        _check_build(rc, keys)
        return index

    def lookup(self, index, keys, values, query, out, found, rows=None) -> int:
        query = np.ascontiguousarray(query, dtype=np.uint64)
        return int(self.lookup_raw(
            index.ctypes.data, index.shape[0], keys.ctypes.data, values.ctypes.data,
            values.shape[1], query.ctypes.data, query.shape[0], out.ctypes.data,
            found.ctypes.data, None if rows is None else rows.ctypes.data))

    # inline table (tab: uint64[cap, w], tabf: the same memory as float32[cap, 2 * w])
    def build_table(self, tab, tabf, sentinel, keys, values) -> None:
        rc = self._lib.cube_build_table(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel,
                                        keys.ctypes.data, values.ctypes.data, keys.shape[0],
                                        values.shape[1])
        _check_insert(rc, keys, sentinel)

    def table_upsert(self, tab, tabf, sentinel, count, keys, values) -> int:
        rc = self._lib.cube_table_insert(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel,
                                         count, keys.ctypes.data, values.ctypes.data,
                                         keys.shape[0], values.shape[1], 1)
        _check_insert(rc, keys, sentinel)
        return int(rc)

    def table_rehash(self, src, src_sentinel, dst, dstf, dst_sentinel) -> int:
        self._lib.cube_table_clear(dst.ctypes.data, dst.shape[0], dst.strides[0], dst_sentinel)
        rc = self._lib.cube_table_rehash(src.ctypes.data, src.shape[0], src_sentinel, dst.ctypes.data,
                                         dst.shape[0], dst_sentinel, dst.strides[0])
        if rc < 0:
            raise ValueError("table rehash failed: destination too small or holds the sentinel")
        return int(rc)

    def table_lookup(self, tab, tabf, sentinel, dim, query, out, found) -> int:
        query = np.ascontiguousarray(query, dtype=np.uint64)
        return int(self.table_lookup_raw(
            tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel, dim, query.ctypes.data,
            query.shape[0], None if out is None else out.ctypes.data, found.ctypes.data))


def _check_insert(rc: int, keys: np.ndarray, sentinel: int) -> None:
    if rc >= 0:
        return
    i = -rc - 1
    if i >= keys.shape[0]:
        raise ValueError(f"inline table capacity too small for {keys.shape[0]} more keys")
    if int(keys[i]) == sentinel:
        raise ValueError(f"key {sentinel} at row {i} is the table's sentinel")
    raise ValueError(f"duplicate key {int(keys[i])} at row {i}")


def _check_build(rc: int, keys: np.ndarray) -> None:
    if rc == 0:
        return
    i = -rc - 1
    if i >= keys.shape[0]:
        raise ValueError(f"hash index capacity too small for {keys.shape[0]} keys")
    raise ValueError(f"duplicate key {int(keys[i])} at row {i}")


class _NumbaKernel:
    """The same algorithms with numba (no ``lookup_raw``)."""

    name = "numba"
    lookup_raw = None
    table_lookup_raw = None

    def __init__(self) -> None:
        from runtime.cube import _numba_kernel as nk  # imports numba (heavy)

        self._nk = nk

    def build_index(self, keys: np.ndarray, cap: int) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        index = np.empty(cap, dtype=np.int32)
        _check_build(int(self._nk.build_index(keys, index)), keys)
        return index

    def lookup(self, index, keys, values, query, out, found, rows=None) -> int:
        query = np.ascontiguousarray(query, dtype=np.uint64)
        if rows is None:
            rows = np.empty(query.shape[0], dtype=np.int64)
        return int(self._nk.lookup(index, keys, values, query, out.reshape(query.shape[0], -1),
                                   found.view(np.uint8), rows))

    def build_table(self, tab, tabf, sentinel, keys, values) -> None:
        _check_insert(int(self._nk.build_table(tab, tabf, np.uint64(sentinel), keys, values)), keys, sentinel)

    def table_upsert(self, tab, tabf, sentinel, count, keys, values) -> int:
        rc = int(self._nk.table_insert(tab, tabf, np.uint64(sentinel), count, keys, values, True))
        _check_insert(rc, keys, sentinel)
        return rc

    def table_rehash(self, src, src_sentinel, dst, dstf, dst_sentinel) -> int:
        rc = int(self._nk.table_rehash(src, np.uint64(src_sentinel), dst, dstf, np.uint64(dst_sentinel)))
        if rc < 0:
            raise ValueError("table rehash failed: destination too small or holds the sentinel")
        return rc

    def table_lookup(self, tab, tabf, sentinel, dim, query, out, found) -> int:
        query = np.ascontiguousarray(query, dtype=np.uint64)
        if out is None:
            out = np.empty((query.shape[0], dim), np.float32)
        return int(self._nk.table_lookup(tab, tabf, np.uint64(sentinel), dim, query,
                                         out.reshape(query.shape[0], dim), found.view(np.uint8)))


def _load():
    want = os.environ.get("ELASTIC_CTR_CUBE_KERNEL", "c")
    if want == "c":
        try:
            return _CKernel()
        except (KernelError, OSError) as exc:
            log.warning("C kernel unavailable (%s): falling back to numba", exc)
    return _NumbaKernel()


#: The process-wide kernel, loaded at import.
KERNEL = _load()


if __name__ == "__main__":  # prebuild (e.g. in a Dockerfile)
    print(f"cube kernel backend: {KERNEL.name}")
