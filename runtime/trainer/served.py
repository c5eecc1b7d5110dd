"""What the cube serves, as trainer 0 knows it: the keys of the published chain (the rows
with an embedding), so that every export makes the cube follow the parameter servers'
table (``runtime.trainer.lifecycle``).

The contract with the cube (docs/cube.md, "Deletions"): a row of zeros, the table's
default row, is what a lookup of a key the cube does not hold answers, so the cube holds
no zero row. A **base** carries only rows with an embedding (a feasign not admitted pulls
zeros and is left out). A **patch** carries the rows of the feasigns fed since the last
export, and a row of zeros **deletes** its key: for a feasign the trainer no longer holds
an embedding for (evicted by a shrink point and not re-admitted), and for every key of the
served chain that a shrink point evicted (``evicted``), fed or not. A zero row of a key the
chain does not hold is left out (nothing to delete).

``ServedKeys.keys`` is None until the first base of this process (after a restart the
chain is not known here): patches then keep every zero row (a deletion of a key the cube
does not hold changes nothing there), and the continuous job makes the first export a
base when rows are evicted (``runtime.trainer.online``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np


def zero_rows(values: np.ndarray) -> np.ndarray:
    """bool[n]: the rows of ``values`` (float32[n, dim]) that are all zeros (the default row)."""
    return ~np.asarray(values).any(axis=1)


class ServedKeys:
    """Trainer 0's record (module docstring): ``keys`` (uint64[k] sorted, or None:
    unknown), ``pending`` (uint64[m] sorted: keys a shrink point evicted from the chain,
    deleted by the next export), ``admitted`` / ``deleted``: keys added to and removed from
    the chain by the last export (counts)."""

    def __init__(self) -> None:
        self.keys: Optional[np.ndarray] = None
        self.pending = np.zeros(0, np.uint64)
        self.admitted = self.deleted = 0

    def cut(self, keys: np.ndarray, values: np.ndarray, base: bool) -> tuple[np.ndarray, np.ndarray]:
        """The rows an export publishes, from the rows read off the table: ``keys``
        uint64[n] unique, ``values`` float32[n, dim] (a base: the whole table; a patch: the
        fed feasigns' rows). A base keeps its rows with an embedding; a patch keeps those,
        plus a zero row for every pending deletion and every fed key of the chain that
        reads zeros. Returns ``(keys uint64[k] sorted, values float32[k, dim])``."""
        keys = np.asarray(keys, np.uint64)
        values = np.asarray(values, np.float32)
        zero = zero_rows(values)
        if base:
            keep = ~zero
        else:
            missing = np.setdiff1d(self.pending, keys, assume_unique=True)
            if len(missing):
                keys = np.concatenate([keys, missing])
                values = np.concatenate([values, np.zeros((len(missing), values.shape[1]), np.float32)])
                zero = np.concatenate([zero, np.ones(len(missing), bool)])
            keep = ~zero
            if self.keys is None:
                keep |= zero
            else:
                keep |= zero & np.isin(keys, self.keys, assume_unique=True)
        keys, values = keys[keep], values[keep]
        order = np.argsort(keys, kind="stable")
        return keys[order], np.ascontiguousarray(values[order])

    def published(self, keys: np.ndarray, values: np.ndarray, base: bool) -> None:
        """Records an export's rows (as ``cut`` gave them) once published: the chain's keys
        become the base's, or take the patch's rows with an embedding and lose its zero
        rows; the pending deletions are done."""
        keys = np.asarray(keys, np.uint64)
        zero = zero_rows(values)
        live, gone = keys[~zero], keys[zero]
        if base:
            known = self.keys is not None
            self.admitted = len(np.setdiff1d(live, self.keys, assume_unique=True)) if known else len(live)
            self.deleted = len(np.setdiff1d(self.keys, live, assume_unique=True)) if known else 0
            self.keys = np.sort(live)
        elif self.keys is None:
            self.admitted = self.deleted = 0
        else:
            new = np.setdiff1d(live, self.keys, assume_unique=True)
            drop = np.intersect1d(gone, self.keys, assume_unique=True)
            self.admitted, self.deleted = len(new), len(drop)
            self.keys = np.union1d(np.setdiff1d(self.keys, drop, assume_unique=True), new)
        self.pending = np.zeros(0, np.uint64)

    def evicted(self, table_keys: np.ndarray) -> int:
        """After a shrink point: every key of the chain not in ``table_keys`` (uint64[t],
        the parameter servers' keys after the shrink, any order) is pending deletion.
        Returns how many were added (0 while the chain is unknown)."""
        if self.keys is None:
            return 0
        gone = np.setdiff1d(self.keys, np.asarray(table_keys, np.uint64))
        before = len(self.pending)
        self.pending = np.union1d(self.pending, gone)
        return len(self.pending) - before
