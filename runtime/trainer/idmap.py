"""Id maps: uint64 feasigns -> the ids a program looks its embeddings up by, where that is
not the feasign itself (the parameter-server table is keyed by feasign and needs none).

* ``Vocab``: the single-process table's rows, grown on the fly (row 0 = unseen).
* ``geo_rows``: GEO's fixed-size hashed table (``--ps-mode geo``).
"""
from __future__ import annotations

import numpy as np


class Vocab:
    """feasign (uint64) -> row of the single-process embedding table; row 0 = unseen (the
    zero vector). Rows are given in first-seen order and never change."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.index: dict[int, int] = {}

    def __call__(self, fs: np.ndarray, grow: bool = True) -> np.ndarray:
        """Maps uint64[n,S] feasigns to uint64[n,S] rows (0 = unseen when not growing).
        Raises ``RuntimeError`` when the table is full."""
        u, inv = np.unique(fs, return_inverse=True)
        d = self.index
        rows = np.empty(len(u), dtype=np.uint64)
        for j, k in enumerate(u.tolist()):
            r = d.get(k)
            if r is None:
                if grow:
                    if len(d) + 1 >= self.capacity:
                        raise RuntimeError(f"single-process vocabulary full ({self.capacity} rows): "
                                           "raise --single-vocab-size")
                    r = d[k] = len(d) + 1
                else:
                    r = 0
            rows[j] = r
        return rows[inv.reshape(fs.shape)]

    def keys(self) -> np.ndarray:
        """uint64[m]: the feasign of row ``i + 1`` at index ``i``."""
        return np.fromiter(self.index.keys(), dtype=np.uint64, count=len(self.index))

    def restore(self, keys: np.ndarray) -> None:
        """Sets the mapping to ``keys`` (uint64[m], row ``i + 1`` = ``keys[i]``)."""
        self.index = {int(k): i + 1 for i, k in enumerate(keys.tolist())}


def geo_rows(rows: int):
    """GEO's id map: uint64 feasigns -> rows ``1 + feasign mod (rows - 1)`` of a table of
    ``rows`` rows (row 0 is the zero padding row). Feasigns that share a row share an
    embedding: the cost of GEO's fixed-size table."""
    m = np.uint64(rows - 1)

    def f(feasigns: np.ndarray) -> np.ndarray:
        return (np.asarray(feasigns, dtype=np.uint64) % m) + np.uint64(1)

    return f
