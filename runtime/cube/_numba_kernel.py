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


# ---------------------------------------------------------------- inline table (see _kernel.c)
# tab: uint64[cap, w] (column 0 = key), tabf: the same memory as float32[cap, 2 * w]
# (value of slot s = tabf[s, 2:2 + dim]). Home slot: mulhi(fmix64(key), cap), the
# high 64 bits of the 128-bit product, computed from 32-bit halves (numba has no uint128).

_M32 = uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _home(k, cap):
    a = _fmix64(k)
    b = uint64(cap)
    a_lo, a_hi = a & _M32, a >> uint64(32)
    b_lo, b_hi = b & _M32, b >> uint64(32)
    p0, p1, p2, p3 = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (p0 >> uint64(32)) + (p1 & _M32) + (p2 & _M32)
    return p3 + (p1 >> uint64(32)) + (p2 >> uint64(32)) + (mid >> uint64(32))


@njit(cache=True, nogil=True)
def table_clear(tab, tabf, sentinel):
    tab[:, :] = 0
    tab[:, 0] = sentinel


@njit(cache=True, nogil=True)
def table_insert(tab, tabf, sentinel, count, keys, values, upsert):
    """As cube_table_insert: returns keys added, -(i+1) duplicate/sentinel keys[i], -(n+1) full."""
    cap = tab.shape[0]
    n = keys.shape[0]
    dim = values.shape[1]
    added = 0
    for i in range(n):
        k = keys[i]
        if k == sentinel:
            return -(i + 1)
        h = _home(k, cap)
        while tab[h, 0] != k and tab[h, 0] != sentinel:
            h += uint64(1)
            if h == cap:
                h = uint64(0)
        if tab[h, 0] == k:
            if not upsert:
                return -(i + 1)
        else:
            if count + added + 1 >= cap:
                return -(n + 1)
            tab[h, 0] = k
            added += 1
        tabf[h, 2:2 + dim] = values[i, :]
    return added


@njit(cache=True, nogil=True)
def build_table(tab, tabf, sentinel, keys, values):
    table_clear(tab, tabf, sentinel)
    return table_insert(tab, tabf, sentinel, 0, keys, values, False)


@njit(cache=True, nogil=True)
def table_rehash(src, src_sentinel, dst, dstf, dst_sentinel):
    table_clear(dst, dstf, dst_sentinel)
    cap = dst.shape[0]
    moved = 0
    for s in range(src.shape[0]):
        k = src[s, 0]
        if k == src_sentinel:
            continue
        if k == dst_sentinel or moved + 1 >= cap:
            return -1
        h = _home(k, cap)
        while dst[h, 0] != dst_sentinel:
            h += uint64(1)
            if h == cap:
                h = uint64(0)
        dst[h, :] = src[s, :]
        moved += 1
    return moved


@njit(cache=True, nogil=True)
def table_lookup(tab, tabf, sentinel, dim, q, out, found):
    """out: float32[qn, dim]; found: uint8[qn]. Returns hits."""
    cap = tab.shape[0]
    hits = 0
    for j in range(q.shape[0]):
        k = q[j]
        hit = False
        h = uint64(0)
        if k != sentinel:
            h = _home(k, cap)
            while tab[h, 0] != k and tab[h, 0] != sentinel:
                h += uint64(1)
                if h == cap:
                    h = uint64(0)
            hit = tab[h, 0] == k
        if hit:
            out[j, :] = tabf[h, 2:2 + dim]
            found[j] = 1
            hits += 1
        else:
            out[j, :] = 0
            found[j] = 0
    return hits
