"""Shard dict format: round trip, validation of truncated/corrupt dicts, the server's load mode."""
from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.cube import dictfile
from tests.helpers import make_data


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


def test_server_load_skips_the_index_but_checks_its_size(tmp_path):
    """``index=False`` (the server's load) reads keys and values only, yet still refuses a
    truncated index file and corrupt values."""
    path, keys, values = _write(tmp_path)
    d = dictfile.load_shard_dict(path, index=False)
    assert d.index is None
    np.testing.assert_array_equal(d.keys, keys)
    np.testing.assert_array_equal(d.values, values)
    (path / "index.i32").write_bytes(b"\xff" * (d.meta.capacity * 4))  # wrong content, right size
    dictfile.load_shard_dict(path, index=False)  # not read: no error
    with pytest.raises(dictfile.DictFormatError, match="index.i32.*crc32"):
        dictfile.load_shard_dict(path)
    (path / "index.i32").write_bytes(b"\xff" * 8)
    with pytest.raises(dictfile.DictFormatError, match="index.i32.*truncated"):
        dictfile.load_shard_dict(path, index=False)
    data = bytearray((path / "values.f32").read_bytes())
    data[7] ^= 0x01
    (path / "values.f32").write_bytes(bytes(data))
    (path / "index.i32").write_bytes(b"\xff" * (d.meta.capacity * 4))
    with pytest.raises(dictfile.DictFormatError, match="values.f32.*crc32"):
        dictfile.load_shard_dict(path, index=False)


def test_chunked_load_gives_the_rows_in_order_and_checks_crc_at_the_end(tmp_path):
    path, keys, values = _write(tmp_path, n=1000)
    meta, k, chunks = dictfile.load_shard_dict_chunked(path, chunk_rows=300)
    got = list(chunks)
    assert meta.count == 1000 and [s for s, _ in got] == [0, 300, 600, 900] and got[-1][1].shape == (100, 4)
    np.testing.assert_array_equal(k, keys)
    np.testing.assert_array_equal(np.concatenate([v for _, v in got]), values)
    raw = bytearray((path / "values.f32").read_bytes())
    raw[-1] ^= 0xFF  # in the last chunk: found once it has been read
    (path / "values.f32").write_bytes(bytes(raw))
    meta, k, chunks = dictfile.load_shard_dict_chunked(path, chunk_rows=300)
    with pytest.raises(dictfile.DictFormatError, match="values.f32: crc32"):
        list(chunks)
    raw = bytearray((path / "keys.u64").read_bytes())
    raw[0] ^= 0xFF
    (path / "keys.u64").write_bytes(bytes(raw))
    with pytest.raises(dictfile.DictFormatError, match="keys.u64: crc32"):
        dictfile.load_shard_dict_chunked(path)
    (path / "values.f32").write_bytes(bytes(raw[:100]))
    with pytest.raises(dictfile.DictFormatError, match="truncated"):
        dictfile.load_shard_dict_chunked(path)
