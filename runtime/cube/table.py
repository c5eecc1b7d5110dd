"""The cube server's in-memory form of a dict version: an inline open-addressing table.

Built at load time from a shard dict's ``keys.u64`` / ``values.f32`` (the on-disk format,
``runtime/cube/dictfile.py``, is unchanged; its ``index.i32`` is validated on load but not
used for serving). Layout (``kernel.c``, "inline table"): ``cap`` slots of ``stride =
8 * ceil((8 + 4 * dim) / 8)`` bytes, each ``uint64 key`` then ``float32 value[dim]`` (then
padding), held as ``uint64[cap, stride // 8]``. An empty slot holds the table's
``sentinel`` key (a key absent from the dict) and zero values. Home slot of a key:
``(fmix64(key) * cap) >> 64`` over 128 bits (MurmurHash3's 64-bit finalizer, then Lemire's
multiply-shift range reduction: ``cap`` need not be a power of two), linear probing.
``cap = max(16, ceil(count / LOAD))``: load factor ~``LOAD`` (0.6) after a build, at most
``MAX_LOAD`` (0.7) after patches; a hit reads (1 + 1 / (1 - a)) / 2 slots on average (Knuth):
1.75 at 0.6, 2.5 at 0.75.

Why: a lookup then touches ~1 random page per key (the slot, 48 bytes for dim 10) instead
of 3 (index slot, keys row, values row); under nested paging the TLB misses of those
random pages are most of a lookup's cost. Memory: ``cap * stride`` bytes, e.g. 1M keys x
10 float32 -> 1.67M x 48 B = 76 MiB (raw keys + values: 46 MiB); the keys/values arrays are
not kept.

Deletions: a row of zeros is the table's default row (what a miss answers), so a slot
holding a zero row is a **dead** key (``kernel.c``): lookups answer it as a miss, a patch
deletes a key by carrying a zero row, and a new key reuses a dead slot. A table counts its
``used`` slots (live and dead keys: the load factor) and its live keys (``count``).

Patches: ``merge`` writes rows into a table in place (when they fit under ``MAX_LOAD`` and
none is the sentinel; ``fits``); ``upsert`` is copy on write (a new table: a copy, or a
rehash into a larger one with a new sentinel if needed, which leaves the dead keys out).
What the server serves, a base table with its extensions and patch overlays, is a
``VersionView`` (``runtime/cube/views.py``).
"""
from __future__ import annotations

import math

import numpy as np

from runtime.cube.kernel import KERNEL

#: load factor of a freshly built table, and the most a patch may fill it before it grows
LOAD, MAX_LOAD = 0.6, 0.7
#: bits per key of an overlay's Bloom filter (2 set per key: ~2 % false positives at 16);
#: a lookup probes an overlay only for a key its filter may hold
FILTER_BITS = 16
_U64_MAX = 2**64 - 1


def table_capacity(count: int, load: float = LOAD) -> int:
    """Slots for ``count`` keys: ``max(16, ceil(count / load))`` (always > count)."""
    return max(16, math.ceil(count / load), count + 1)


def choose_sentinel(*key_arrays: np.ndarray, avoid: tuple[int, ...] = ()) -> int:
    """A uint64 key absent from every array (and not in ``avoid``): tries 2**64-1, 0,
    2**64-2, 1 (one vectorized scan each), else the smallest gap of the sorted keys."""
    arrays = [np.asarray(a, dtype=np.uint64).ravel() for a in key_arrays]
    for c in (_U64_MAX, 0, _U64_MAX - 1, 1):
        if c not in avoid and not any(bool((a == np.uint64(c)).any()) for a in arrays):
            return c
    taken = np.unique(np.concatenate(arrays + [np.array(avoid, np.uint64)]))
    # taken is sorted and unique with < 2**64 elements: a gap exists
    if taken[0] != 0:
        return 0
    gaps = np.flatnonzero(np.diff(taken) > 1)
    if gaps.size:
        return int(taken[gaps[0]]) + 1
    return int(taken[-1]) + 1


def zero_rows(values: np.ndarray) -> np.ndarray:
    """bool[n]: the rows of ``values`` (float32[n, dim]) that are all zeros: deletions."""
    return ~np.asarray(values).any(axis=1)


class InlineTable:
    """An inline table (see the module docstring): a base or a patch's overlay. Changed
    only by ``merge`` (in place, under the conditions it states); ``upsert`` returns a new
    one.

    Attributes: ``tab`` uint64[cap, stride // 8] (column 0 = keys), ``tabf`` the same
    memory as float32[cap, stride // 4] (values in columns 2 .. 2 + dim), ``sentinel``,
    ``count`` (live keys held), ``used`` (slots occupied: live and dead keys), ``dim``,
    ``filter`` (None, or its Bloom filter: an overlay)."""

    __slots__ = ("tab", "tabf", "sentinel", "count", "used", "dim", "filter")

    def __init__(self, tab: np.ndarray, sentinel: int, count: int, dim: int, used: int | None = None):
        self.tab, self.sentinel, self.count, self.dim = tab, int(sentinel), int(count), int(dim)
        self.used = self.count if used is None else int(used)
        self.tabf = tab.view(np.float32)
        self.filter: np.ndarray | None = None  # an overlay's Bloom filter (``with_filter``)

    def with_filter(self) -> "InlineTable":
        """Builds this table's Bloom filter of its keys, live and dead (``kernel.c``: uint64
        words, ``FILTER_BITS`` bits per key, 2 bits per key set): a view then probes the
        table only for a query the filter may hold. Call once the table is complete (a key
        added later would be missed). Returns ``self``."""
        words = np.empty(max(1, math.ceil(self.used * FILTER_BITS / 64)), np.uint64)
        KERNEL.filter_build(self.tab, self.sentinel, words)
        self.filter = words
        return self

    @staticmethod
    def _alloc(cap: int, dim: int) -> np.ndarray:
        return np.empty((cap, (8 + 4 * dim + 7) // 8), np.uint64)

    @classmethod
    def build(cls, keys: np.ndarray, values: np.ndarray, load: float = LOAD) -> "InlineTable":
        """From unique ``keys: uint64[n]`` and ``values: float32[n, dim]`` (the C kernel),
        at load factor ``load``; a zero row is left out (a fresh table holds no dead key).
        Raises ``ValueError`` on duplicate keys or bad shapes."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if values.ndim != 2 or values.shape[0] != keys.shape[0] or values.shape[1] < 1:
            raise ValueError(f"values must be float32[{keys.shape[0]}, dim >= 1], got {values.shape}")
        dim = values.shape[1]
        sentinel = choose_sentinel(keys)
        tab = cls._alloc(table_capacity(keys.shape[0], load), dim)
        t = cls(tab, sentinel, 0, dim)
        t.count = t.used = KERNEL.build_table(tab, t.tabf, sentinel, keys, values)
        return t

    @property
    def capacity(self) -> int:
        return int(self.tab.shape[0])

    @property
    def stride(self) -> int:
        """Bytes per slot."""
        return int(self.tab.strides[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the table and its filter."""
        return int(self.tab.nbytes) + (0 if self.filter is None else int(self.filter.nbytes))

    def __len__(self) -> int:
        return self.count

    def lookup(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``query: uint64[q]`` -> ``(values float32[q, dim] (zeros for misses), found bool[q])``
        (a dead key is a miss)."""
        query = np.ascontiguousarray(query, dtype=np.uint64)
        out = np.empty((query.shape[0], self.dim), np.float32)
        found = np.empty(query.shape[0], np.uint8)
        KERNEL.table_lookup(self.tab, self.tabf, self.sentinel, self.dim, query, out, found)
        return out, found == 1

    def _states(self, query: np.ndarray) -> np.ndarray:
        query = np.ascontiguousarray(query, dtype=np.uint64)
        found = np.empty(query.shape[0], np.uint8)
        KERNEL.table_lookup(self.tab, self.tabf, self.sentinel, self.dim, query, None, found)
        return found

    def contains(self, query: np.ndarray) -> np.ndarray:
        """``query: uint64[q]`` -> bool[q]: live keys (no values copied)."""
        return self._states(query) == 1

    def holds(self, query: np.ndarray) -> np.ndarray:
        """``query: uint64[q]`` -> bool[q]: keys with a slot here, live or dead."""
        return self._states(query) != 0

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``(keys uint64[used], values float32[used, dim])`` of every occupied slot, dead
        keys (zero rows) included, in slot order (copies)."""
        used = self.tab[:, 0] != np.uint64(self.sentinel)
        return self.tab[used, 0].copy(), self.tabf[used, 2:2 + self.dim].copy()

    def _patch_rows(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if values.ndim != 2 or values.shape != (keys.shape[0], self.dim):
            raise ValueError(f"values must be float32[{keys.shape[0]}, {self.dim}], got {values.shape}")
        return keys, values

    def _grow(self, keys: np.ndarray, values: np.ndarray | None = None) -> int:
        """Slots ``merge(keys, values)`` may newly occupy at most: its keys without a slot
        here (with a nonzero row: a zero row of a key not held is not stored)."""
        new = ~self.holds(keys)
        if values is not None:
            new &= ~zero_rows(values)
        return int(np.count_nonzero(new))

    def fits(self, keys: np.ndarray, values: np.ndarray | None = None) -> bool:
        """Whether ``merge(keys, values)`` can write in place: no key is the sentinel and the
        table stays at most ``MAX_LOAD`` full (O(len(keys))); without ``values`` every key
        counts as a new one when not held."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if bool((keys == np.uint64(self.sentinel)).any()):
            return False
        used = self.used + self._grow(keys, values)
        return used <= MAX_LOAD * self.capacity and used < self.capacity

    def merge(self, keys: np.ndarray, values: np.ndarray) -> int:
        """In place: updates or adds unique ``keys: uint64[n]`` with ``values: float32[n,
        dim]`` (a zero row deletes its key); returns the change of live keys. Cost O(n), no
        allocation of the table's size. Readers may run meanwhile, on the condition that
        none of them can read a key being merged from this table (the server's views:
        ``VersionView.folded``); a probe for any other key is answered as before. Raises
        ``ValueError`` when the rows do not ``fit`` (nothing written), or on bad shapes or
        repeated keys."""
        keys, values = self._patch_rows(keys, values)
        if not self.fits(keys, values):
            raise ValueError(f"{keys.shape[0]} rows do not fit in place (capacity {self.capacity}, "
                             f"{self.used} slots used, sentinel {self.sentinel})")
        if np.unique(keys).shape[0] != keys.shape[0]:
            raise ValueError("patch keys repeat")
        added, live = KERNEL.table_upsert(self.tab, self.tabf, self.sentinel, self.used, keys, values)
        self.used += added
        self.count += live
        return live

    def upsert(self, keys: np.ndarray, values: np.ndarray, compact: bool = False) -> "InlineTable":
        """Copy on write: a new table = this one with ``keys`` updated, added or deleted
        (zero rows; unique ``keys: uint64[n]``, ``values: float32[n, dim]``). A copy when the
        rows fit and not ``compact``, else a rehash (dead keys left out) into a table for the
        live keys at ``LOAD``. This table is not modified."""
        keys, values = self._patch_rows(keys, values)
        if np.unique(keys).shape[0] != keys.shape[0]:
            raise ValueError("patch keys repeat")
        grow = self._grow(keys, values)
        sentinel = self.sentinel
        if bool((keys == np.uint64(sentinel)).any()):
            sentinel = choose_sentinel(self.tab[:, 0], keys, avoid=(self.sentinel,))
        used = self.used + grow
        if not compact and sentinel == self.sentinel and used <= MAX_LOAD * self.capacity and used < self.capacity:
            t = InlineTable(self.tab.copy(), sentinel, self.count, self.dim, self.used)
        else:
            cap = table_capacity(self.count + grow)
            tab = self._alloc(cap if compact else max(cap, self.capacity), self.dim)
            moved = KERNEL.table_rehash(self.tab, self.sentinel, tab, tab.view(np.float32), sentinel, self.dim)
            t = InlineTable(tab, sentinel, moved, self.dim)
        added, live = KERNEL.table_upsert(t.tab, t.tabf, sentinel, t.used, keys, values)
        t.used += added
        t.count += live
        return t
