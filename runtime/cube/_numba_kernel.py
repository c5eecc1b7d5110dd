"""numba version of ``_kernel.c`` (fallback when no C compiler exists); same layout,
hash (MurmurHash3 fmix64, high bits) and linear probing."""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

_C1 = uint64(0xFF51AFD7ED558CCD)
_C2 = uint64(0xC4CEB9FE1A85EC53)


@njit(cache=True, nogil=True, inline="always")
def _fmix64(k):
    k ^= k >> uint64(33)
    k *= _C1
    k ^= k >> uint64(33)
    k *= _C2
    k ^= k >> uint64(33)
    return k


@njit(cache=True, nogil=True)
def _shift(cap):
    b = 0
    while (1 << b) < cap:
        b += 1
    return uint64(64 - b)


@njit(cache=True, nogil=True)
def build_index(keys, index):
    """keys: uint64[n]; index: int32[cap] (filled). Returns 0, -(i+1) on duplicate keys[i]."""
    cap = index.shape[0]
    n = keys.shape[0]
    if cap < n + 1:
        return -(n + 1)
    mask = uint64(cap - 1)
    sh = _shift(cap)
    index[:] = -1
    for i in range(n):
        k = keys[i]
        h = _fmix64(k) >> sh if sh < 64 else uint64(0)
        while index[h] >= 0:
            if keys[index[h]] == k:
                return -(i + 1)
            h = (h + uint64(1)) & mask
        index[h] = i
    return 0


@njit(cache=True, nogil=True)
def lookup(index, keys, values, q, out, found, rows):
    """out: float32[qn, dim]; found: uint8[qn]; rows: int64[qn]. Returns hits."""
    cap = index.shape[0]
    mask = uint64(cap - 1)
    sh = _shift(cap)
    hits = 0
    for j in range(q.shape[0]):
        k = q[j]
        h = _fmix64(k) >> sh if sh < 64 else uint64(0)
        row = index[h]
        while row >= 0 and keys[row] != k:
            h = (h + uint64(1)) & mask
            row = index[h]
        rows[j] = row
        if row >= 0:
            out[j, :] = values[row, :]
            found[j] = 1
            hits += 1
        else:
            out[j, :] = 0
            found[j] = 0
    return hits
