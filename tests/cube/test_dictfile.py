"""Shard dict format: round trip, validation of truncated/corrupt dicts, copy-on-write patches."""
from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.cube import dictfile
from runtime.cube._kernel import KERNEL, _NumbaKernel
from tests.cube.dataplane_helpers import make_data


def _write(tmp_path, n=1000, dim=4, version=7, mode="base", base_version=None, seed=0):
    keys, values = make_data(n, dim, seed)
    d = dictfile.make_shard_dict(keys, values, dict_name="emb", shard=1, shard_num=2, version=version,
                                 mode=mode, base_version=base_version)
    path = tmp_path / f"v{version}"
    dictfile.write_shard_dict(path, d)
    return path, keys, values


def test_round_trip_and_lookup(tmp_path):
    path, keys, values = _write(tmp_path)
    d = dictfile.load_shard_dict(path)
    assert d.meta.count == 1000 and d.meta.dim == 4 and d.meta.version == 7 and d.meta.shard == 1
    assert d.meta.capacity >= 2 * 1000 + 1 and d.meta.capacity & (d.meta.capacity - 1) == 0
    q = np.concatenate([keys[::7], keys[:5] ^ np.uint64(1 << 63)])  # hits then (almost surely) misses
    out, found = d.lookup(q)
    n_hit = len(keys[::7])
    assert found[:n_hit].all() and not found[n_hit:].any()
    np.testing.assert_array_equal(out[:n_hit], values[::7])
    assert (out[n_hit:] == 0).all()
    meta = json.loads((path / "meta.json").read_text())
    assert meta["bytes"] == sum(f.stat().st_size for f in path.iterdir() if f.name != "meta.json")


def test_mmap_load_matches(tmp_path):
    path, keys, values = _write(tmp_path)
    d = dictfile.load_shard_dict(path, mmap=True)
    out, found = d.lookup(keys)
    assert found.all()
    np.testing.assert_array_equal(out, values)


def test_truncated_values_refused(tmp_path):
    path, _, _ = _write(tmp_path)
    data = (path / "values.f32").read_bytes()
    (path / "values.f32").write_bytes(data[:-4])
    with pytest.raises(dictfile.DictFormatError, match="values.f32.*truncated"):
        dictfile.load_shard_dict(path)


def test_corrupt_byte_refused(tmp_path):
    path, _, _ = _write(tmp_path)
    data = bytearray((path / "keys.u64").read_bytes())
    data[100] ^= 0xFF
    (path / "keys.u64").write_bytes(bytes(data))
    with pytest.raises(dictfile.DictFormatError, match="crc32"):
        dictfile.load_shard_dict(path)


def test_bad_meta_refused(tmp_path):
    path, _, _ = _write(tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    meta["count"] = "many"
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(dictfile.DictFormatError, match="count"):
        dictfile.load_shard_dict(path)
    with pytest.raises(dictfile.DictFormatError, match="no meta.json"):
        dictfile.load_shard_dict(tmp_path / "nowhere")


def test_duplicate_keys_rejected_by_index():
    with pytest.raises(ValueError, match="duplicate key 5"):
        dictfile.make_shard_dict(np.array([5, 6, 5], np.uint64), np.zeros((3, 2), np.float32),
                                 dict_name="x", shard=0, shard_num=1, version=1)


def test_apply_patch_is_copy_on_write(tmp_path):
    keys, values = make_data(500, 3, seed=1)
    base = dictfile.make_shard_dict(keys, values, dict_name="emb", shard=0, shard_num=1, version=1)
    base_values = base.values.copy()
    new_keys = make_data(550, 3, seed=2)[0]
    new_keys = new_keys[~np.isin(new_keys, keys)][:20]
    dkeys = np.concatenate([keys[:10], new_keys])
    dvals = np.full((30, 3), 9.0, np.float32)
    delta = dictfile.make_shard_dict(dkeys, dvals, dict_name="emb", shard=0, shard_num=1, version=2,
                                     mode="delta", base_version=1)
    merged = dictfile.apply_patch(base, delta)
    assert merged.version == 2 and len(merged) == 520 and merged.meta.base_version == 1
    out, found = merged.lookup(np.concatenate([keys, new_keys]))
    assert found.all()
    assert (out[:10] == 9).all() and (out[500:] == 9).all()
    np.testing.assert_array_equal(out[10:500], values[10:])
    np.testing.assert_array_equal(base.values, base_values)  # the served base is untouched
    out_b, found_b = base.lookup(new_keys)
    assert not found_b.any()


def test_patch_of_other_shard_refused():
    a = dictfile.make_shard_dict(np.array([2], np.uint64), np.zeros((1, 2), np.float32), dict_name="emb",
                                 shard=0, shard_num=2, version=1)
    b = dictfile.make_shard_dict(np.array([3], np.uint64), np.zeros((1, 2), np.float32), dict_name="emb",
                                 shard=1, shard_num=2, version=2, mode="delta", base_version=1)
    with pytest.raises(dictfile.DictFormatError, match="does not fit"):
        dictfile.apply_patch(a, b)


def test_c_and_numba_kernels_agree():
    if KERNEL.name != "c":
        pytest.skip("the C kernel is not available here")
    keys, values = make_data(3000, 5, seed=3)
    cap = dictfile.capacity_for(3000)
    nk = _NumbaKernel()
    idx = KERNEL.build_index(keys, cap)
    np.testing.assert_array_equal(nk.build_index(keys, cap), idx)
    q = np.concatenate([keys[::3], keys[:50] + np.uint64(1)])
    o1, f1 = np.empty((len(q), 5), np.float32), np.empty(len(q), np.uint8)
    o2, f2 = np.empty_like(o1), np.empty_like(f1)
    assert KERNEL.lookup(idx, keys, values, q, o1, f1) == nk.lookup(idx, keys, values, q, o2, f2)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(f1, f2)
