"""The cube data plane's hot loops, in C (``kernel.c``, ``kernel_client.c``): hash index
build and batch lookup of the dict files, the server's inline table (build, upsert in
place, rehash, lookup) and versioned views (a stack of tables read newest first, pinned
by lookups), and the client's request path (split a batch by shard, one request per
shard, gather the replies: ``CubeClient.seek``'s common case, with the GIL released).

``kernel.c`` and ``kernel_client.c`` are compiled when the project is installed (a
setuptools extension module, ``runtime.cube._kernel``; it exports plain C functions, no
Python module) and called
through ctypes, which releases the GIL for the duration of each call. C rather than a
JIT: a process importing numba holds ~145 MiB more RSS before any data, which alone
breaks the server's memory target (1.6 x raw bytes + 60 MiB); the C library adds < 1 MiB.

Index layout and hash: see ``kernel.c`` and ``runtime/cube/dictfile.py``.
"""
from __future__ import annotations

import ctypes
import importlib.util
import logging

import numpy as np

log = logging.getLogger(__name__)


#: Outcomes of ``cube_client_seek`` for a shard besides a reply's status byte (``kernel.c``).
SEEK_NONE, SEEK_IO, SEEK_TIMEOUT, SEEK_MALFORMED = -1, -2, -3, -4


class KernelError(RuntimeError):
    """The compiled kernel is missing or cannot be loaded (the project was not installed
    with ``pip install``, which builds it)."""


def library_path() -> str:
    """Path of the compiled ``runtime.cube._kernel`` shared library. Raises ``KernelError``."""
    spec = importlib.util.find_spec("runtime.cube._kernel")
    if spec is None or not spec.origin or not spec.origin.endswith(".so"):
        raise KernelError("runtime.cube._kernel is not built: install the project (pip install -e . or "
                          "make install), which compiles runtime/cube/kernel.c with the system C compiler")
    return spec.origin


class CKernel:
    """ctypes binding of ``kernel.c``: the array-level entries check shapes via numpy and
    raise ``ValueError`` (duplicate key, table too small); the ``*_raw`` entries take
    addresses and check nothing (the server's hot path). Raises ``KernelError`` when the
    library cannot be loaded."""

    name = "c"

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(library_path())
        except OSError as exc:
            raise KernelError(f"cannot load the cube kernel: {exc}") from exc
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
        lib.cube_table_insert.argtypes = [vp, i64, i64, u64, i64, vp, vp, i64, i64, ctypes.c_int, vp]
        lib.cube_table_insert.restype = i64
        lib.cube_table_rehash.argtypes = [vp, i64, u64, vp, i64, u64, i64, i64]
        lib.cube_table_reuse.argtypes = [vp, i64, i64, u64, vp, vp, i64, i64, vp]
        lib.cube_table_reuse.restype = i64
        lib.cube_table_rehash.restype = i64
        lib.cube_table_lookup.argtypes = [vp, i64, i64, u64, i64, vp, i64, vp, vp]
        lib.cube_table_lookup.restype = i64
        lib.cube_table_merge.argtypes = [vp, i64, u64, i64, vp, i64, u64, i64, i64, ctypes.c_int, vp]
        lib.cube_table_merge.restype = i64
        lib.cube_filter_build.argtypes = [vp, i64, i64, u64, vp, i64, ctypes.c_int]
        lib.cube_filter_build.restype = None
        lib.cube_view_lookup.argtypes = [vp, vp, i64, vp, vp]
        lib.cube_view_lookup.restype = i64
        lib.cube_view_pins.argtypes = [vp]
        lib.cube_view_pins.restype = i64
        lib.cube_view_retire.argtypes = [vp]
        lib.cube_view_retire.restype = None
        #: raw entry of a versioned view's lookup (``runtime/cube/table.py``, ``VersionView``):
        #: (view_addr, q_addr, qn, out_addr or None, found_addr) -> hits, or -1 when the view
        #: is retired, -2 when it has more than 16 tables (nothing written). No checks: used
        #: by the server's hot path.
        self.view_lookup_raw = lib.cube_view_lookup
        #: (view_addr) -> lookups in progress on the view; (view_addr) -> None: retire it.
        self.view_pins, self.view_retire = lib.cube_view_pins, lib.cube_view_retire
        self._lib = lib
        #: raw entry of the inline table's lookup: (table_addr, cap, stride_bytes, sentinel,
        #: dim, q_addr, qn, out_addr or None, found_addr) -> hits; addresses are ints (no
        #: checks: callers own the buffers' sizes). Used by the server's hot path.
        self.table_lookup_raw = lib.cube_table_lookup
        #: raw entry: (index_addr, cap, keys_addr, values_addr, dim, q_addr, qn, out_addr,
        #: found_addr, rows_addr or None) -> hits; addresses are ints (no checks: callers
        #: own the buffers' sizes). Used by the server's hot path.
        self.lookup_raw = lib.cube_lookup
        lib.cube_client_seek.argtypes = [vp, i64, i64, vp, i64, u64, i64, vp, vp, vp]
        lib.cube_client_seek.restype = i64
        #: raw entry of the cube client's request path (``CubeClient.seek``'s common case):
        #: (keys_addr, n, shard_num, fds_addr int32[shard_num], dim, version or 0,
        #: timeout_us, values_addr float32[n, dim], found_addr bool[n], meta_addr
        #: int64[3 * shard_num]) -> 0 (every shard asked answered OK), 1 (some did not:
        #: ``meta`` says which, see ``kernel.c``), -1 (out of memory, nothing sent).
        self.client_seek_raw = lib.cube_client_seek

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
    def build_table(self, tab, tabf, sentinel, keys, values) -> int:
        """Clears ``tab`` and inserts ``keys``/``values`` (a zero row is not stored); returns
        the keys stored. Raises ``ValueError`` (a duplicate key, the sentinel, too small)."""
        rc = self._lib.cube_build_table(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel,
                                        keys.ctypes.data, values.ctypes.data, keys.shape[0],
                                        values.shape[1])
        _check_insert(rc, keys, sentinel)
        return int(rc)

    def table_upsert(self, tab, tabf, sentinel, used, keys, values, upsert: bool = True) -> tuple[int, int]:
        """Inserts ``keys``/``values`` into ``tab`` (``used`` slots occupied). ``upsert``:
        a key already held takes the new value, a zero row deletes its key (it is not stored
        for a key not held) and a new key may reuse a dead slot (``kernel.c``); ``False``:
        every row is stored, a key already held is an error (an overlay, where a zero row
        shadows the base). Returns ``(slots newly occupied, change of live keys)``. Raises
        ``ValueError``."""
        delta = np.zeros(2, np.int64)
        rc = self._lib.cube_table_insert(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel,
                                         used, keys.ctypes.data, values.ctypes.data,
                                         keys.shape[0], values.shape[1], 3 if upsert else 0, delta.ctypes.data)
        _check_insert(rc, keys, sentinel)
        return int(delta[0]), int(delta[1])

    def table_reuse(self, tab, sentinel, keys, values) -> np.ndarray:
        """Places each of ``keys`` (uint64[n], not held by ``tab``; ``values`` float32[n,
        dim], nonzero rows) into a dead slot on its probe chain where there is one; returns
        bool[n]: placed (``kernel.c``)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        values = np.ascontiguousarray(values, dtype=np.float32)
        placed = np.zeros(keys.shape[0], np.uint8)
        self._lib.cube_table_reuse(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel, keys.ctypes.data,
                                   values.ctypes.data, keys.shape[0], values.shape[1], placed.ctypes.data)
        return placed.view(bool)

    def filter_build(self, tab, sentinel, words, clear: bool = True) -> None:
        """Fills ``words`` (uint64[>= 1]) with the Bloom filter of ``tab``'s keys (``kernel.c``);
        ``clear=False``: adds them to the words as they are (one filter of several tables)."""
        self._lib.cube_filter_build(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel,
                                    words.ctypes.data, words.shape[0], 1 if clear else 0)

    def table_clear(self, tab, sentinel) -> None:
        """Empties ``tab``: every key the ``sentinel``, every value 0."""
        self._lib.cube_table_clear(tab.ctypes.data, tab.shape[0], tab.strides[0], sentinel)

    def table_rehash(self, src, src_sentinel, dst, dstf, dst_sentinel, dim: int) -> int:
        """Clears ``dst`` and re-inserts ``src``'s live keys (dead ones left out); returns
        how many. Raises ``ValueError`` when ``dst`` is too small or holds the sentinel."""
        self._lib.cube_table_clear(dst.ctypes.data, dst.shape[0], dst.strides[0], dst_sentinel)
        rc = self._lib.cube_table_rehash(src.ctypes.data, src.shape[0], src_sentinel, dst.ctypes.data,
                                         dst.shape[0], dst_sentinel, dst.strides[0], dim)
        if rc < 0:
            raise ValueError("table rehash failed: destination too small or holds the sentinel")
        return int(rc)

    def table_merge(self, dst, dst_sentinel, dst_used, src, src_sentinel, dim: int,
                    count_only: bool) -> tuple[int, int] | None:
        """Every key of table ``src`` upserted into table ``dst`` in place (same stride; a
        zero row deletes: ``table_upsert``); returns ``(slots newly occupied, change of live
        keys)`` (``count_only``: an upper bound of the slots, nothing written, live 0), or
        None when a ``src`` key is ``dst_sentinel`` or ``dst`` would be full."""
        delta = np.zeros(2, np.int64)
        rc = self._lib.cube_table_merge(dst.ctypes.data, dst.shape[0], dst_sentinel, dst_used,
                                        src.ctypes.data, src.shape[0], src_sentinel, dst.strides[0], dim,
                                        1 if count_only else 0, delta.ctypes.data)
        return None if rc < 0 else (int(delta[0]), int(delta[1]))

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


#: The process-wide kernel, loaded at import.
KERNEL = CKernel()
