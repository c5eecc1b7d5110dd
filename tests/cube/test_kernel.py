"""The C kernel (runtime/cube/kernel.c) against reference implementations written here in
Python from the layouts' specification (runtime/cube/dictfile.py, runtime/cube/table.py):
same slots byte for byte on small inputs, same answers as a dict on large ones."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.cube import table
from runtime.cube.kernel import KERNEL

M64 = 2**64 - 1


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finalizer."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def ref_index(keys: np.ndarray, cap: int) -> np.ndarray:
    """dictfile's index: home fmix64(key) >> (64 - log2 cap), linear probing, row or -1."""
    shift = 64 - (cap.bit_length() - 1)
    index = np.full(cap, -1, np.int32)
    for row, k in enumerate(keys.tolist()):
        h = fmix64(k) >> shift if shift < 64 else 0
        while index[h] >= 0:
            h = (h + 1) % cap
        index[h] = row
    return index


def ref_table_slots(keys: np.ndarray, cap: int, sentinel: int) -> np.ndarray:
    """table.py's slots: home (fmix64(key) * cap) >> 64, linear probing; the key per slot."""
    slots = np.full(cap, sentinel, np.uint64)
    for k in keys.tolist():
        h = (fmix64(k) * cap) >> 64
        while int(slots[h]) != sentinel:
            h = (h + 1) % cap
        slots[h] = k
    return slots


def test_index_layout_and_lookup():
    rng = np.random.default_rng(7)
    # Keys of one shard of 4 (all == 1 mod 4): the low bits are not random.
    keys = np.unique(rng.integers(0, 2**62, 3000, dtype=np.uint64)) * np.uint64(4) + np.uint64(1)
    values = rng.random((keys.shape[0], 5), dtype=np.float32)
    cap = 1 << int(np.ceil(np.log2(2 * keys.shape[0])))
    index = KERNEL.build_index(keys, cap)
    np.testing.assert_array_equal(index, ref_index(keys, cap))
    query = np.concatenate([rng.choice(keys, 3000), rng.integers(0, 2**64 - 1, 1000, dtype=np.uint64)])
    out = np.full((query.shape[0], 5), np.nan, np.float32)
    found = np.zeros(query.shape[0], np.uint8)
    hits = KERNEL.lookup(index, keys, values, query, out, found)
    rows = {int(k): i for i, k in enumerate(keys)}
    want = np.array([int(q) in rows for q in query])
    assert hits == int(want.sum()) >= 3000
    np.testing.assert_array_equal(found.astype(bool), want)
    np.testing.assert_array_equal(out[want], values[[rows[int(q)] for q in query[want]]])
    assert not out[~want].any()  # misses are zero vectors


def test_duplicate_and_full_table_errors():
    with pytest.raises(ValueError, match="duplicate key 5 at row 2"):
        KERNEL.build_index(np.array([1, 5, 5], np.uint64), 8)
    with pytest.raises(ValueError, match="capacity"):
        KERNEL.build_index(np.arange(8, dtype=np.uint64), 8)


def check_table(t: table.InlineTable, keys, values):
    """t holds exactly keys -> values; misses are zeros; the sentinel is not a key."""
    assert len(t) == keys.shape[0] and t.count < t.capacity
    assert t.sentinel not in set(int(k) for k in keys)
    got_k, got_v = t.items()
    order, ref = np.argsort(got_k), np.argsort(keys)
    np.testing.assert_array_equal(got_k[order], keys[ref])
    np.testing.assert_array_equal(got_v[order], values[ref])
    out, found = t.lookup(keys)
    assert found.all()
    np.testing.assert_array_equal(out, values)
    absent = np.array([t.sentinel], np.uint64)
    out, found = t.lookup(absent)
    assert not found.any() and not out.any()


def test_table_home_slot_is_multiply_shift_of_fmix64():
    key = 0x1234_5678_9ABC_DEF1
    for t in [table.InlineTable.build(np.array([key], np.uint64), np.ones((1, 3), np.float32))]:
        cap = t.capacity
        home = (fmix64(key) * cap) >> 64
        assert t.tab[home, 0] == key and t.stride == 24
        np.testing.assert_array_equal(t.tabf[home, 2:5], [1, 1, 1])
        assert (t.tab[:, 0] == np.uint64(t.sentinel)).sum() == cap - 1


def test_table_layout_and_lookup():
    rng = np.random.default_rng(11)
    keys = rng.permutation(np.unique(rng.integers(0, 2**62, 3000, dtype=np.uint64)) * np.uint64(4) + np.uint64(3))
    values = rng.random((keys.shape[0], 10), dtype=np.float32)
    query = np.concatenate([rng.choice(keys, 5000), rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64)])
    t = table.InlineTable.build(keys, values)
    assert t.stride == 48 and t.capacity == table.table_capacity(keys.shape[0]) > keys.shape[0] / 0.61
    np.testing.assert_array_equal(t.tab[:, 0], ref_table_slots(keys, t.capacity, t.sentinel))
    out, found = t.lookup(query)
    pos = {int(k): i for i, k in enumerate(keys)}
    want = np.array([int(q) in pos for q in query])
    np.testing.assert_array_equal(found, want)
    np.testing.assert_array_equal(out[want], values[[pos[int(k)] for k in query[want]]])
    assert not out[~want].any()
    check_table(t, keys, values)
    # the raw entry the server uses, with its own buffers
    raw_out = np.full((query.shape[0], 10), np.nan, np.float32)
    raw_found = np.zeros(query.shape[0], np.uint8)
    hits = KERNEL.table_lookup_raw(t.tab.ctypes.data, t.capacity, t.stride, t.sentinel, 10,
                                   query.ctypes.data, query.shape[0], raw_out.ctypes.data, raw_found.ctypes.data)
    assert hits == int(want.sum())
    np.testing.assert_array_equal(raw_out, out)


@pytest.mark.parametrize("extreme", [[0, M64], [0, 1, M64, M64 - 1], [M64, M64 - 1, 0, 1, 2, 3]])
def test_table_sentinel_is_never_a_key(extreme):
    rng = np.random.default_rng(3)
    keys = np.unique(np.concatenate([np.array(extreme, np.uint64),
                                     rng.integers(4, 2**63, 500, dtype=np.uint64)]))
    values = rng.random((keys.shape[0], 4), dtype=np.float32)
    t = table.InlineTable.build(keys, values)
    np.testing.assert_array_equal(t.tab[:, 0], ref_table_slots(keys, t.capacity, t.sentinel))
    check_table(t, keys, values)
    out, found = t.lookup(np.array(extreme, np.uint64))
    assert found.all()
    if len(extreme) > 2:
        assert t.sentinel not in (0, 1, M64, M64 - 1)  # fell back to the gap search


def test_table_upsert_is_copy_on_write_and_grows():
    rng = np.random.default_rng(5)
    keys = rng.permutation(np.unique(rng.integers(0, 2**63, 3000, dtype=np.uint64)))
    values = rng.random((keys.shape[0], 6), dtype=np.float32)
    upd = keys[:800]
    new = np.unique(rng.integers(2**63, M64 - 2, 4000, dtype=np.uint64))
    pk = rng.permutation(np.concatenate([upd, new]))
    pv = rng.random((pk.shape[0], 6), dtype=np.float32)
    ref = dict(zip(keys.tolist(), values))
    ref.update(zip(pk.tolist(), pv))
    rk = np.array(list(ref), np.uint64)
    rv = np.array(list(ref.values()), np.float32)

    bc = table.InlineTable.build(keys, values)
    before = bc.tab.copy()
    mc = bc.upsert(pk, pv)
    np.testing.assert_array_equal(bc.tab, before)  # the served table is untouched
    check_table(bc, keys, values)
    uc = mc.upsert(rk[:100], rv[:100] + 1)  # fits: a copy, same capacity
    assert mc.capacity > bc.capacity and mc.count == rk.shape[0] <= table.MAX_LOAD * mc.capacity
    check_table(mc, rk, rv)
    assert uc.capacity == mc.capacity and uc.sentinel == mc.sentinel
    np.testing.assert_array_equal(uc.tab[:, 0], mc.tab[:, 0])  # updates stay in their slots
    want = rv.copy()
    want[:100] += 1
    check_table(uc, rk, want)


def test_table_upsert_of_the_sentinel_picks_another():
    keys = np.arange(1, 101, dtype=np.uint64)
    values = np.ones((100, 2), np.float32)
    bc = table.InlineTable.build(keys, values)
    assert bc.sentinel == M64
    mc = bc.upsert(np.array([M64, 0, 5], np.uint64), np.full((3, 2), 7, np.float32))
    assert mc.sentinel not in (M64, 0)
    rk = np.concatenate([keys, np.array([M64, 0], np.uint64)])
    rv = np.concatenate([values, np.full((2, 2), 7, np.float32)])
    rv[4] = 7
    check_table(mc, rk, rv)
    check_table(bc, keys, values)


def test_table_errors():
    with pytest.raises(ValueError, match="duplicate key 5 at row 2"):
        table.InlineTable.build(np.array([1, 5, 5], np.uint64), np.ones((3, 2), np.float32))
    t = table.InlineTable.build(np.array([1, 5], np.uint64), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="repeat"):
        t.upsert(np.array([7, 7], np.uint64), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="float32"):
        t.upsert(np.array([7], np.uint64), np.ones((1, 3), np.float32))
