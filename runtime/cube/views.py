"""The cube server's served versions: ``VersionView``, a base inline table with its extensions and patch overlays.

A view reads its tables newest first: the overlays of the patches applied since the last
merge, then the base (an ``InlineTable``, ``runtime/cube/table.py``) and the **extensions**
that hold the keys added past the base's headroom (each a table of about ``GROW_STEP`` of
the base's slots, so the table grows by steps of its new keys, never by a copy). A patch
becomes a new overlay (``patched``); ``folded`` merges the overlays into the base and the
extensions, in place while they fit, else by a copy. docs/cube.md, "Versions in place", has
the design and its invariants; ``kernel.c``'s ``cube_view_lookup`` reads a view's ``buf``.
"""
from __future__ import annotations

import math
import time

import numpy as np

from runtime.cube.kernel import KERNEL
from runtime.cube.table import FILTER_BITS, MAX_LOAD, InlineTable, choose_sentinel, table_capacity, zero_rows

#: most tables (overlays + extensions + base) one view reads (``kernel.c``'s VIEW_MAX_TABLES)
MAX_TABLES = 16
#: an extension's slots: at least this fraction of its base's (each holds up to ``MAX_LOAD``
#: of them: about 7 % more keys than its base was built with)
GROW_STEP = 1 / 16
#: most extensions of a view; a merge that would need one more rebuilds the base (a copy of
#: the table, once the table grew by about half since its base was loaded)
MAX_EXTENSIONS = 8


def extensions_filter(extensions: list[InlineTable]) -> np.ndarray:
    """One Bloom filter (``kernel.c``'s, ``FILTER_BITS`` bits per key) of the keys of every
    table of ``extensions``: uint64 words. O(their slots)."""
    words = np.empty(max(1, math.ceil(sum(e.used for e in extensions) * FILTER_BITS / 64)), np.uint64)
    for i, e in enumerate(extensions):
        KERNEL.filter_build(e.tab, e.sentinel, words, clear=i == 0)
    return words


def _newest_rows(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``rows``: ``(keys uint64[n_i], values float32[n_i, dim])`` oldest first, each with
    unique keys -> their union, a key's row the newest one holding it."""
    keys = np.concatenate([k for k, _ in rows])
    values = np.concatenate([v for _, v in rows])
    if len(rows) > 1:
        _, last = np.unique(keys[::-1], return_index=True)
        keep = keys.shape[0] - 1 - last
        keys, values = keys[keep], values[keep]
    return keys, values


class VersionRetired(RuntimeError):
    """A lookup on a ``VersionView`` that was retired (no longer served)."""


class VersionView:
    """One served version: ``base`` (an ``InlineTable``), ``extensions`` (``InlineTable``
    each, with a Bloom filter: keys added past the base's headroom, disjoint from the
    base's and from each other's) and ``overlays`` (``InlineTable`` each, oldest first: the
    patches applied since the last merge), read newest first: a key's value is the one of
    the newest overlay holding it, else of the base or the extension holding it.
    ``version``: its id; ``count``: keys it holds; ``dim``. Views of successive versions
    share the base and the extensions' tables.

    ``ext_filter``: one Bloom filter of every extension's keys (``extensions_filter``;
    None without extensions): a key the base lacks is looked for in the extensions only
    when it may hold it.

    ``buf`` is the view as ``kernel.c``'s ``cube_view_lookup`` reads it (uint64: pins,
    retired, dim, stride, table count, tables probed first (overlays + base), the
    extensions' filter's address and words, then
    address, capacity, sentinel, filter address and words per table: overlays newest
    first, the base, the extensions, probed only for keys the others lack); ``addr`` its
    address (the server's hot path calls ``KERNEL.view_lookup_raw`` with it). A view holds
    references to its tables, so they live as long as it does. Raises ``ValueError`` when
    the tables' dims differ or they are more than ``MAX_TABLES``."""

    __slots__ = ("base", "overlays", "extensions", "ext_filter", "version", "count", "dim", "buf", "addr")

    def __init__(self, base: InlineTable, overlays: list[InlineTable], version: int, count: int,
                 extensions: list[InlineTable] | tuple = (), ext_filter: np.ndarray | None = None):
        self.base, self.overlays, self.version, self.count = base, list(overlays), int(version), int(count)
        self.extensions = list(extensions)
        self.ext_filter = ext_filter if self.extensions else None
        if self.extensions and ext_filter is None:
            self.ext_filter = extensions_filter(self.extensions)
        self.dim = base.dim
        tables = self.overlays[::-1] + [base] + self.extensions
        if any(t.dim != base.dim for t in tables):
            raise ValueError(f"overlays and extensions must have the base's dim {base.dim}")
        if len(tables) > MAX_TABLES:
            raise ValueError(f"a view reads at most {MAX_TABLES} tables, got {len(tables)}: fold it first")
        self.buf = np.zeros(8 + 5 * len(tables), np.uint64)
        ef = self.ext_filter
        self.buf[2:8] = (self.dim, base.stride, len(tables), len(self.overlays) + 1,
                         0 if ef is None else ef.ctypes.data, 0 if ef is None else ef.shape[0])
        for i, t in enumerate(tables):
            f = t.filter
            self.buf[8 + 5 * i: 13 + 5 * i] = (t.tab.ctypes.data, t.capacity, t.sentinel,
                                               0 if f is None else f.ctypes.data, 0 if f is None else f.shape[0])
        self.addr = self.buf.ctypes.data

    @classmethod
    def of_base(cls, keys: np.ndarray, values: np.ndarray, version: int) -> "VersionView":
        """A view of a base: a table built from ``keys``/``values`` (``InlineTable.build``)."""
        t = InlineTable.build(keys, values)
        return cls(t, [], version, t.count)

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """Bytes of the tables it reads (the base and extensions, shared with other views,
        included)."""
        return self.base.nbytes + sum(t.nbytes for t in self.extensions + self.overlays)

    @property
    def retired(self) -> bool:
        return bool(self.buf[1])

    def lookup(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``query: uint64[q]`` -> ``(values float32[q, dim] (zeros for misses), found
        bool[q])``. Raises ``VersionRetired``."""
        query = np.ascontiguousarray(query, dtype=np.uint64)
        out = np.empty((query.shape[0], self.dim), np.float32)
        found = np.empty(query.shape[0], np.uint8)
        if KERNEL.view_lookup_raw(self.addr, query.ctypes.data, query.shape[0], out.ctypes.data,
                                  found.ctypes.data) < 0:
            raise VersionRetired(f"version {self.version} is retired")
        return out, found.view(bool)

    def contains(self, query: np.ndarray) -> np.ndarray:
        """``query: uint64[q]`` -> bool[q]. Raises ``VersionRetired``."""
        query = np.ascontiguousarray(query, dtype=np.uint64)
        found = np.empty(query.shape[0], np.uint8)
        if KERNEL.view_lookup_raw(self.addr, query.ctypes.data, query.shape[0], None, found.ctypes.data) < 0:
            raise VersionRetired(f"version {self.version} is retired")
        return found.view(bool)

    def patched(self, keys: np.ndarray, values: np.ndarray, version: int) -> "VersionView":
        """The view of ``version`` = this one with the patch rows (unique ``keys:
        uint64[n]``, ``values: float32[n, dim]``) as a new overlay (``patched_chunks``)."""
        return self.patched_chunks(keys, [(0, values)], version)

    def patched_chunks(self, keys: np.ndarray, chunks, version: int) -> "VersionView":
        """As ``patched``, the values given as ``chunks``: an iterable of ``(first row,
        float32[m, dim])`` covering rows ``0 .. n`` in order
        (``dictfile.load_shard_dict_chunked``), so only one chunk of them is held at a
        time. The overlay gets a Bloom filter (``InlineTable.with_filter``): most lookups
        miss it and then do not probe it. Nothing shared is modified; memory O(n). Raises
        ``ValueError`` on bad shapes or repeated keys, and whatever ``chunks`` raises
        (nothing is then served)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if keys.ndim != 1:
            raise ValueError(f"keys must be uint64[n], got shape {keys.shape}")
        sentinel = choose_sentinel(keys)
        tab = InlineTable._alloc(table_capacity(keys.shape[0]), self.dim)
        KERNEL.table_clear(tab, sentinel)
        overlay = InlineTable(tab, sentinel, 0, self.dim)
        at = change = 0  # change: of the view's live keys
        for start, values in chunks:
            values = np.ascontiguousarray(values, dtype=np.float32)
            m = values.shape[0] if values.ndim == 2 else -1
            if start != at or values.ndim != 2 or values.shape[1] != self.dim or at + m > keys.shape[0]:
                raise ValueError(f"values must be float32[m, {self.dim}] rows from {at} of {keys.shape[0]}: "
                                 f"got a chunk at row {start} of shape {values.shape}")
            added, live = KERNEL.table_upsert(tab, overlay.tabf, sentinel, overlay.used, keys[at:at + m], values,
                                              upsert=False)  # zero rows kept: they shadow the older tables
            overlay.used += added
            overlay.count += live
            held, zero = self.contains(keys[at:at + m]), zero_rows(values)
            change += int(np.count_nonzero(~zero & ~held)) - int(np.count_nonzero(zero & held))
            at += m
        if at != keys.shape[0]:
            raise ValueError(f"values chunks cover {at} rows of {keys.shape[0]} keys")
        overlay.with_filter()
        return VersionView(self.base, self.overlays + [overlay], version, self.count + change, self.extensions,
                           self.ext_filter)

    def folded(self, in_place: bool = True) -> "VersionView":
        """The same version with its overlays merged, oldest first, into the base and the
        extensions: a view with no overlay (or ``self`` when it has none).

        In place when ``in_place``: the rows of keys the base or an extension holds are
        written there (a zero row makes its key dead there); new keys go into a dead slot
        or into the base while it stays under ``MAX_LOAD`` and none
        is its sentinel (``KERNEL.table_merge``, GIL released), else into the last
        extension, or a new one (``GROW_STEP`` of the base's slots, or the new keys' need)
        when that does not fit them: memory grows with the new keys only. A merged
        extension is a new ``InlineTable`` on the same memory with a rebuilt filter (the
        views being read keep theirs). By a copy (``InlineTable.upsert``: a new base
        holding the extensions' rows too) when not ``in_place`` or past
        ``MAX_EXTENSIONS``. In place, the caller guarantees that no lookup runs or starts
        on a view of this base lacking one of these overlays (``retire`` +
        ``wait_unpinned``); lookups on this view may run meanwhile: a merged key is found
        in its overlay first."""
        if not self.overlays:
            return self
        if in_place:
            extensions = self._merge_in_place()
            if extensions is not None:
                assert self.base.count + sum(e.count for e in extensions) == self.count, (
                    self.base.count, [e.count for e in extensions], self.count)
                same = len(extensions) == len(self.extensions) and all(
                    a is b for a, b in zip(extensions, self.extensions))
                return VersionView(self.base, [], self.version, self.count, extensions,
                                   self.ext_filter if same else None)
        keys, values = _newest_rows([e.items() for e in self.extensions] + [t.items() for t in self.overlays])
        base = self.base.upsert(keys, values, compact=True)
        assert base.count == self.count, (base.count, self.count)
        return VersionView(base, [], self.version, self.count)

    def _merge_in_place(self) -> list[InlineTable] | None:
        """``folded``'s in-place merge; returns the extensions of the merged view, or None
        (nothing written) when it would need more than ``MAX_EXTENSIONS``."""
        base = self.base
        sentinel = np.array([base.sentinel], np.uint64)
        if not self.extensions and not any(bool(t.holds(sentinel)[0]) for t in self.overlays):
            # an upper bound of the slots taken (a new key in two overlays counts twice)
            new = sum(KERNEL.table_merge(base.tab, base.sentinel, base.used, t.tab, t.sentinel, self.dim, True)[0]
                      for t in self.overlays)
            if base.used + new <= MAX_LOAD * base.capacity and base.used + new < base.capacity:
                for t in self.overlays:  # oldest first: the newest row of a key is written last
                    done = KERNEL.table_merge(base.tab, base.sentinel, base.used, t.tab, t.sentinel, self.dim, False)
                    assert done is not None  # checked above
                    base.used += done[0]
                    base.count += done[1]
                return []
        keys, values = _newest_rows([t.items() for t in self.overlays])
        held = base.holds(keys)
        extensions = list(self.extensions)
        owner = np.full(keys.shape[0], -1, np.int64)  # -1: new key, else its extension
        for i, e in enumerate(extensions):
            rest = np.flatnonzero(~held & (owner < 0))
            owner[rest[e.holds(keys[rest])]] = i
        new = (~held) & (owner < 0) & ~zero_rows(values)  # the deletion of a key held nowhere: nothing to do
        for i, t in [(-1, base)] + list(enumerate(extensions)):  # new keys into dead slots first: no growth
            idx = np.flatnonzero(new)
            if not len(idx):
                break
            placed = KERNEL.table_reuse(t.tab, t.sentinel, keys[idx], values[idx])
            if placed.any():
                new[idx[placed]] = False
                if i < 0:
                    base.count += int(np.count_nonzero(placed))
                else:  # a new object on the same memory with its new keys in its filter
                    extensions[i] = InlineTable(t.tab, t.sentinel, t.count + int(np.count_nonzero(placed)), t.dim,
                                                t.used).with_filter()
        room = min(int(MAX_LOAD * base.capacity), base.capacity - 1) - base.used
        to_base = not extensions and int(new.sum()) <= room and not bool((keys[new] == sentinel[0]).any())
        last = extensions[-1] if extensions else None
        to_last = not to_base and last is not None and last.fits(keys[new])
        if not (to_base or to_last or not new.any()):
            dead = base.used - base.count + sum(e.used - e.count for e in extensions)
            if len(extensions) >= MAX_EXTENSIONS or dead >= max(int(new.sum()), GROW_STEP * MAX_LOAD * base.capacity):
                return None  # a copy, which leaves the dead keys out, instead of one more extension
        if to_base:
            held |= new
        added, live = KERNEL.table_upsert(base.tab, base.tabf, base.sentinel, base.used, keys[held], values[held])
        base.used += added
        base.count += live
        for i, e in enumerate(extensions):
            mine = owner == i
            grows = to_last and i == len(extensions) - 1 and bool(new.any())
            if grows:
                mine |= new
            if mine.any():
                KERNEL.table_upsert(e.tab, e.tabf, e.sentinel, e.used, keys[mine], values[mine])
                occupied = e.tab[:, 0] != np.uint64(e.sentinel)  # O(its slots), as its filter
                used = int(np.count_nonzero(occupied))
                live = int(np.count_nonzero(occupied & e.tabf[:, 2:2 + e.dim].any(axis=1)))
                if grows or (used, live) != (e.used, e.count):
                    # a new object on the same memory: the views being read keep their filter
                    extensions[i] = InlineTable(e.tab, e.sentinel, live, e.dim, used).with_filter()
        if new.any() and not (to_base or to_last):
            cap = max(table_capacity(int(new.sum())), math.ceil(GROW_STEP * base.capacity))
            ext = InlineTable(InlineTable._alloc(cap, self.dim), choose_sentinel(keys[new], avoid=(base.sentinel,)),
                              0, self.dim)  # a sentinel the base may hold as a key later
            KERNEL.table_clear(ext.tab, ext.sentinel)
            ext.used, ext.count = KERNEL.table_upsert(ext.tab, ext.tabf, ext.sentinel, 0, keys[new], values[new],
                                                      upsert=False)
            extensions.append(ext.with_filter())
        return extensions

    def retire(self) -> None:
        """Lookups on this view answer ``VersionRetired`` from now on (those in progress finish)."""
        KERNEL.view_retire(self.addr)

    @property
    def pinned(self) -> bool:
        """Whether a lookup is in progress on this view."""
        return KERNEL.view_pins(self.addr) > 0

    def wait_unpinned(self, timeout_s: float = 10.0) -> bool:
        """Waits until no lookup is in progress on this view (after ``retire``: none will
        start); False after ``timeout_s`` s."""
        deadline = time.monotonic() + timeout_s
        while KERNEL.view_pins(self.addr) > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0002)
        return True
