"""Bitwise table differences and patch application on exported sparse tables
(``runtime.trainer.online``: a pending export cut from whole-table snapshots; tests
replaying a base and its patches as the cube applies them)."""
from __future__ import annotations

import numpy as np


def table_diff(prev_keys: np.ndarray, prev_values: np.ndarray, keys: np.ndarray,
               values: np.ndarray) -> np.ndarray:
    """Indices into ``keys`` of the rows that are new or whose values differ bitwise from
    the previous export. ``prev_keys``/``keys``: uint64[m]/[n] (unique, any order),
    ``prev_values``/``values``: float32[m, d]/[n, d]. Returns int64[k], ascending."""
    if len(prev_keys) == 0:
        return np.arange(len(keys), dtype=np.int64)
    order = np.argsort(prev_keys, kind="stable")
    sk = prev_keys[order]
    pos = np.searchsorted(sk, keys)
    pos_c = np.minimum(pos, len(sk) - 1)
    found = sk[pos_c] == keys
    changed = ~found
    idx = np.flatnonzero(found)
    a = np.ascontiguousarray(values[idx], dtype=np.float32).view(np.uint32)
    b = np.ascontiguousarray(prev_values[order[pos_c[idx]]], dtype=np.float32).view(np.uint32)
    changed[idx] = (a != b).any(axis=1)
    return np.flatnonzero(changed).astype(np.int64)


def apply_patch(keys: np.ndarray, values: np.ndarray, patch_keys: np.ndarray,
                patch_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A table (uint64[n], float32[n, d]) with a patch's rows replacing or adding rows, as
    the cube does; returns it sorted by key."""
    k = np.concatenate([patch_keys, keys])
    v = np.concatenate([patch_values, values])
    uniq, first = np.unique(k, return_index=True)  # the patch's row wins (it comes first)
    return uniq, v[first]
