"""Id maps: uint64 feasigns -> the ids a program looks its embeddings up by, where that is
not the feasign itself (the parameter-server table is keyed by feasign and needs none).

* ``Vocab``: the single-process table's rows, grown on the fly (row 0 = unseen).
* ``geo_rows``: GEO's fixed-size hashed table (``--ps-mode geo``).
"""
from __future__ import annotations

import numpy as np


class Vocab:
    """feasign (uint64) -> row of the single-process embedding table; row 0 = the default
    row (zeros, never trained: ``padding_idx``). The single process's feature lifecycle,
    with the parameter servers' semantics (``runtime.trainer.lifecycle``): every feasign
    fed is counted (``counts``); it gets a row once its count reaches ``min_count`` and
    reads as row 0 before; ``shrink`` decays the counts and evicts the feasigns unfed for
    more than ``unseen_limit`` shrink points, whose rows are reused (``free``) for the next
    feasigns admitted. Rows are given in admission order while no row is free."""

    def __init__(self, capacity: int, min_count: int = 1):
        self.capacity = capacity
        self.min_count = int(min_count)
        self.index: dict[int, int] = {}  # admitted feasign -> row
        self.counts: dict[int, float] = {}  # every feasign fed and not evicted -> its (decayed) count
        self.unseen: dict[int, int] = {}  # -> shrink points since it was last fed
        self.free: list[int] = []  # rows of evicted feasigns, reused first
        self.next_row = 1

    def __call__(self, fs: np.ndarray, grow: bool = True) -> np.ndarray:
        """Maps uint64[n,S] feasigns to uint64[n,S] rows (0 = not admitted). ``grow``: the
        feasigns are being fed: count them and admit those that reach ``min_count``
        (otherwise nothing changes). Raises ``RuntimeError`` when the table is full."""
        u, inv, n = np.unique(fs, return_inverse=True, return_counts=True)
        d = self.index
        rows = np.zeros(len(u), dtype=np.uint64)
        for j, k in enumerate(u.tolist()):
            r = d.get(k)
            if r is None and grow:
                c = self.counts[k] = self.counts.get(k, 0.0) + float(n[j])
                self.unseen[k] = 0
                if c >= self.min_count:
                    r = d[k] = self._take()
            elif grow:
                self.counts[k] += float(n[j])
                self.unseen[k] = 0
            rows[j] = r or 0
        return rows[inv.reshape(fs.shape)]

    def _take(self) -> int:
        if self.free:
            return self.free.pop()
        if self.next_row >= self.capacity:
            raise RuntimeError(f"single-process vocabulary full ({self.capacity} rows): raise --single-vocab-size")
        self.next_row += 1
        return self.next_row - 1

    def shrink(self, decay: float, unseen_limit: int | None) -> np.ndarray:
        """A shrink point: every count times ``decay``, then every feasign unfed for more
        than ``unseen_limit`` shrink points (None: none) is forgotten, then every feasign's
        unseen count goes up by one (the parameter servers' order: ``lifecycle``). Returns
        the rows freed (int64[m]); the caller re-initialises them before they are reused."""
        freed = []
        for k in list(self.counts):
            self.counts[k] *= decay
            if unseen_limit is not None and self.unseen[k] > unseen_limit:
                del self.counts[k], self.unseen[k]
                r = self.index.pop(k, None)
                if r is not None:
                    freed.append(r)
            else:
                self.unseen[k] += 1
        self.free.extend(freed)
        return np.array(freed, np.int64)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """The admitted feasigns and their rows: ``(keys uint64[m], rows int64[m])``."""
        return (np.fromiter(self.index.keys(), dtype=np.uint64, count=len(self.index)),
                np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index)))

    def known(self) -> np.ndarray:
        """uint64[t]: every feasign counted (admitted or not), the table's keys."""
        return np.fromiter(self.counts.keys(), dtype=np.uint64, count=len(self.counts))

    def state(self) -> dict[str, np.ndarray]:
        """The whole vocabulary as arrays (a checkpoint's ``vocab.npz``): ``keys`` uint64[t]
        (every feasign counted), ``counts`` float64[t], ``unseen`` int64[t], ``rows`` int64[t]
        (0: not admitted), ``free`` int64[f], ``next_row`` int64[1]."""
        keys = self.known()
        return {"keys": keys, "counts": np.array([self.counts[k] for k in keys.tolist()], np.float64),
                "unseen": np.array([self.unseen[k] for k in keys.tolist()], np.int64),
                "rows": np.array([self.index.get(k, 0) for k in keys.tolist()], np.int64),
                "free": np.array(self.free, np.int64), "next_row": np.array([self.next_row], np.int64)}

    def restore(self, st) -> None:
        """Sets the vocabulary to a ``state()`` (a mapping of its arrays)."""
        keys = st["keys"].tolist()
        self.counts = dict(zip(keys, st["counts"].tolist()))
        self.unseen = dict(zip(keys, st["unseen"].tolist()))
        self.index = {k: r for k, r in zip(keys, st["rows"].tolist()) if r}
        self.free = st["free"].tolist()
        self.next_row = int(st["next_row"][0])


def geo_rows(rows: int):
    """GEO's id map: uint64 feasigns -> rows ``1 + feasign mod (rows - 1)`` of a table of
    ``rows`` rows (row 0 is the zero padding row). Feasigns that share a row share an
    embedding: the cost of GEO's fixed-size table."""
    m = np.uint64(rows - 1)

    def f(feasigns: np.ndarray) -> np.ndarray:
        return (np.asarray(feasigns, dtype=np.uint64) % m) + np.uint64(1)

    return f
