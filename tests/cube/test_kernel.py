"""The two lookup kernels (C through ctypes, and the numba fallback) agree exactly."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.cube import _kernel


@pytest.fixture(scope="module")
def kernels():
    return _kernel._CKernel(), _kernel._NumbaKernel()


def test_index_and_lookup_agree(kernels):
    ck, nk = kernels
    rng = np.random.default_rng(7)
    # Keys of one shard of 4 (all == 1 mod 4): the low bits are not random.
    keys = np.unique(rng.integers(0, 2**62, 20000, dtype=np.uint64)) * np.uint64(4) + np.uint64(1)
    values = rng.random((keys.shape[0], 5), dtype=np.float32)
    cap = 1 << int(np.ceil(np.log2(2 * keys.shape[0])))
    ic, inb = ck.build_index(keys, cap), nk.build_index(keys, cap)
    np.testing.assert_array_equal(ic, inb)
    query = np.concatenate([rng.choice(keys, 3000), rng.integers(0, 2**64 - 1, 1000, dtype=np.uint64)])
    outs = []
    for k, index in ((ck, ic), (nk, inb)):
        out = np.full((query.shape[0], 5), np.nan, np.float32)
        found = np.zeros(query.shape[0], np.uint8)
        hits = k.lookup(index, keys, values, query, out, found)
        outs.append((hits, out, found))
    (h1, o1, f1), (h2, o2, f2) = outs
    assert h1 == h2 == int(f1.sum()) >= 3000
    np.testing.assert_array_equal(f1, f2)
    np.testing.assert_array_equal(o1, o2)
    pos = np.searchsorted(keys, query[:3000])
    np.testing.assert_array_equal(o1[:3000], values[pos])
    assert not o1[~f1.astype(bool)].any()  # misses are zero vectors


def test_duplicate_and_full_table_errors(kernels):
    for k in kernels:
        with pytest.raises(ValueError, match="duplicate key 5 at row 2"):
            k.build_index(np.array([1, 5, 5], np.uint64), 8)
        with pytest.raises(ValueError, match="capacity"):
            k.build_index(np.arange(8, dtype=np.uint64), 8)


# ---------------------------------------------------------------- inline table (runtime/cube/table.py)
from runtime.cube import table  # noqa: E402

M64 = 2**64 - 1


def fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def both(kernels, monkeypatch, fn):
    """fn() run with the C kernel, then with numba, as runtime.cube.table's kernel."""
    out = []
    for k in kernels:
        monkeypatch.setattr(table, "KERNEL", k)
        out.append(fn())
    return out


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


def test_table_home_slot_is_multiply_shift_of_fmix64(kernels, monkeypatch):
    key = 0x1234_5678_9ABC_DEF1
    for t in both(kernels, monkeypatch, lambda: table.InlineTable.build(np.array([key], np.uint64),
                                                                     np.ones((1, 3), np.float32))):
        cap = t.capacity
        home = (fmix64(key) * cap) >> 64
        assert t.tab[home, 0] == key and t.stride == 24
        np.testing.assert_array_equal(t.tabf[home, 2:5], [1, 1, 1])
        assert (t.tab[:, 0] == np.uint64(t.sentinel)).sum() == cap - 1


def test_table_c_and_numba_agree(kernels, monkeypatch):
    rng = np.random.default_rng(11)
    keys = rng.permutation(np.unique(rng.integers(0, 2**62, 30000, dtype=np.uint64)) * np.uint64(4) + np.uint64(3))
    values = rng.random((keys.shape[0], 10), dtype=np.float32)
    query = np.concatenate([rng.choice(keys, 5000), rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64)])

    def run():
        t = table.InlineTable.build(keys, values)
        return t, t.lookup(query)

    (tc, (oc, fc)), (tn, (on, fn)) = both(kernels, monkeypatch, run)
    assert tc.stride == 48 and tc.capacity == table.table_capacity(keys.shape[0]) > keys.shape[0] / 0.61
    np.testing.assert_array_equal(tc.tab, tn.tab)  # same slots, byte for byte
    np.testing.assert_array_equal(fc, fn)
    np.testing.assert_array_equal(oc, on)
    assert fc[:5000].all() and int(fc.sum()) >= 5000
    pos = {int(k): i for i, k in enumerate(keys)}
    np.testing.assert_array_equal(oc[:5000], values[[pos[int(k)] for k in query[:5000]]])
    assert not oc[~fc].any()
    check_table(tc, keys, values)
    # the raw entry the server uses, with its own buffers
    out = np.full((query.shape[0], 10), np.nan, np.float32)
    found = np.zeros(query.shape[0], np.uint8)
    hits = kernels[0].table_lookup_raw(tc.tab.ctypes.data, tc.capacity, tc.stride, tc.sentinel, 10,
                                       query.ctypes.data, query.shape[0], out.ctypes.data, found.ctypes.data)
    assert hits == int(fc.sum())
    np.testing.assert_array_equal(out, oc)


@pytest.mark.parametrize("extreme", [[0, M64], [0, 1, M64, M64 - 1], [M64, M64 - 1, 0, 1, 2, 3]])
def test_table_sentinel_is_never_a_key(kernels, monkeypatch, extreme):
    rng = np.random.default_rng(3)
    keys = np.unique(np.concatenate([np.array(extreme, np.uint64),
                                     rng.integers(4, 2**63, 500, dtype=np.uint64)]))
    values = rng.random((keys.shape[0], 4), dtype=np.float32)
    tc, tn = both(kernels, monkeypatch, lambda: table.InlineTable.build(keys, values))
    assert tc.sentinel == tn.sentinel
    np.testing.assert_array_equal(tc.tab, tn.tab)
    for t in (tc, tn):
        check_table(t, keys, values)
        out, found = t.lookup(np.array(extreme, np.uint64))
        assert found.all()
    if len(extreme) > 2:
        assert tc.sentinel not in (0, 1, M64, M64 - 1)  # fell back to the gap search


def test_table_upsert_is_copy_on_write_and_grows(kernels, monkeypatch):
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

    def run():
        base = table.InlineTable.build(keys, values)
        before = base.tab.copy()
        merged = base.upsert(pk, pv)
        np.testing.assert_array_equal(base.tab, before)  # the served table is untouched
        check_table(base, keys, values)
        only_updates = merged.upsert(rk[:100], rv[:100] + 1)  # fits: a copy, same capacity
        return base, merged, only_updates

    (bc, mc, uc), (bn, mn, un) = both(kernels, monkeypatch, run)
    assert mc.capacity > bc.capacity and mc.count == rk.shape[0] <= table.MAX_LOAD * mc.capacity
    np.testing.assert_array_equal(mc.tab, mn.tab)
    check_table(mc, rk, rv)
    assert uc.capacity == mc.capacity and uc.sentinel == mc.sentinel
    np.testing.assert_array_equal(uc.tab, un.tab)
    want = rv.copy()
    want[:100] += 1
    check_table(uc, rk, want)


def test_table_upsert_of_the_sentinel_picks_another(kernels, monkeypatch):
    keys = np.arange(1, 101, dtype=np.uint64)
    values = np.ones((100, 2), np.float32)

    def run():
        base = table.InlineTable.build(keys, values)
        assert base.sentinel == M64
        merged = base.upsert(np.array([M64, 0, 5], np.uint64), np.full((3, 2), 7, np.float32))
        return base, merged

    (bc, mc), (bn, mn) = both(kernels, monkeypatch, run)
    assert mc.sentinel not in (M64, 0) and mc.sentinel == mn.sentinel
    np.testing.assert_array_equal(mc.tab, mn.tab)
    rk = np.concatenate([keys, np.array([M64, 0], np.uint64)])
    rv = np.concatenate([values, np.full((2, 2), 7, np.float32)])
    rv[4] = 7
    check_table(mc, rk, rv)
    check_table(bc, keys, values)


def test_table_errors(kernels, monkeypatch):
    for k in kernels:
        monkeypatch.setattr(table, "KERNEL", k)
        with pytest.raises(ValueError, match="duplicate key 5 at row 2"):
            table.InlineTable.build(np.array([1, 5, 5], np.uint64), np.zeros((3, 2), np.float32))
        t = table.InlineTable.build(np.array([1, 5], np.uint64), np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match="repeat"):
            t.upsert(np.array([7, 7], np.uint64), np.zeros((2, 2), np.float32))
        with pytest.raises(ValueError, match="float32"):
            t.upsert(np.array([7], np.uint64), np.zeros((1, 3), np.float32))
