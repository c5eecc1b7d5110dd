"""Cube builder: sharding, last-wins duplicates, tar + md5 layout, deltas, corrupt input."""
from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from runtime import cli
from runtime.cube import dictfile
from runtime.cube.buildinfo import BuildRecord, BuildRecordError, parse_shard_tar_name, shard_tar_name
from runtime.cube.builder import BuildError, build
from runtime.formats.seqfile import SequenceFileError
from runtime.formats.seqfile_writer import write_sequence_file
from runtime.formats.topology import shard_of
from tests.helpers import DICT, build_version, make_data


def test_base_build_layout_and_values(tmp_path):
    keys, values = make_data(5000, 4)
    res = build_version(tmp_path, keys, values, version=100, shard_num=3)
    vdir = tmp_path / "out" / DICT / "100"
    assert res.output_dir == str(vdir) and res.count == 5000 and res.duplicates == 0 and res.dim == 4
    rec = json.loads((vdir / "build.json").read_text())
    assert rec["shard_num"] == 3 and rec["mode"] == "base" and rec["base_version"] is None
    total = 0
    for s in range(3):
        name = f"{DICT}_part{s}"
        tar = vdir / f"{name}.tar"
        md5 = (vdir / f"{name}.tar.md5").read_text().strip()
        assert md5 == hashlib.md5(tar.read_bytes()).hexdigest() == rec["shards"][s]["md5"]
        with tarfile.open(tar) as t:
            assert sorted(t.getnames()) == sorted([name] + [f"{name}/{f}" for f in
                                                            ("meta.json", "keys.u64", "values.f32", "index.i32")])
        d = dictfile.load_shard_dict(vdir / name)
        assert d.meta.shard == s and d.meta.shard_num == 3 and d.meta.version == 100
        assert (shard_of(d.keys, 3) == s).all()
        mine = keys[shard_of(keys, 3) == s]
        out, found = d.lookup(mine)
        assert found.all()
        np.testing.assert_array_equal(out, values[shard_of(keys, 3) == s])
        total += len(d)
    assert total == 5000
    assert not [p for p in (tmp_path / "out" / DICT).iterdir() if p.name.startswith(".")]


def test_duplicates_last_wins_across_files(tmp_path):
    keys, values = make_data(1000, 2)
    src = tmp_path / "src"
    src.mkdir()
    write_sequence_file(src / "part-0", keys, values)
    later = np.full((100, 2), 7.0, np.float32)
    # the second file repeats 100 keys, twice within the file itself: the last copy wins
    write_sequence_file(src / "part-1", np.concatenate([keys[:100], keys[:100]]),
                        np.concatenate([np.zeros((100, 2), np.float32), later]))
    (src / "_SUCCESS").write_text("")  # ignored
    res = build([str(src)], tmp_path / "out", DICT, 2, 5)
    assert res.count == 1000 and res.duplicates == 200 and res.input_records == 1200
    got = np.zeros((1000, 2), np.float32)
    for s in range(2):
        d = dictfile.load_shard_dict(tmp_path / "out" / DICT / "5" / f"{DICT}_part{s}")
        sel = shard_of(keys, 2) == s
        got[sel] = d.lookup(keys[sel])[0]
    np.testing.assert_array_equal(got[:100], later)
    np.testing.assert_array_equal(got[100:], values[100:])


def test_delta_build(tmp_path):
    keys, values = make_data(100, 2)
    res = build_version(tmp_path, keys[:10], values[:10] + 1, version=201, shard_num=2, mode="delta",
                        base_version=200)
    assert res.mode == "delta" and res.base_version == 200 and res.count == 10
    meta = dictfile.read_meta(tmp_path / "out" / DICT / "201" / f"{DICT}_part0")
    assert meta.mode == "delta" and meta.base_version == 200
    with pytest.raises(BuildError, match="base_version"):
        build_version(tmp_path, keys, values, version=202, mode="delta")


def test_corrupt_input_publishes_nothing(tmp_path):
    keys, values = make_data(2000, 4)
    src = tmp_path / "src"
    src.mkdir()
    write_sequence_file(src / "part-0", keys[:1000], values[:1000])
    write_sequence_file(src / "part-1", keys[1000:], values[1000:])
    data = (src / "part-1").read_bytes()
    (src / "part-1").write_bytes(data[: len(data) - 30])  # truncated mid-record
    with pytest.raises(SequenceFileError) as err:
        build([str(src)], tmp_path / "out", DICT, 2, 9)
    assert "part-1" in str(err.value) and err.value.offset > 0
    assert not (tmp_path / "out" / DICT / "9").exists()
    root = tmp_path / "out" / DICT
    assert not root.exists() or list(root.iterdir()) == []  # no temp directory left either


def test_dim_mismatch_and_missing_input(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_sequence_file(src / "a", np.arange(3, dtype=np.uint64), np.zeros((3, 2), np.float32))
    write_sequence_file(src / "b", np.arange(3, 6, dtype=np.uint64), np.zeros((3, 3), np.float32))
    with pytest.raises(BuildError, match="dim 3"):
        build([str(src)], tmp_path / "out", DICT, 1, 1)
    with pytest.raises(BuildError, match="no SequenceFile"):
        build([str(tmp_path / "nope*")], tmp_path / "out", DICT, 1, 1)


def test_rebuild_replaces_version(tmp_path):
    keys, values = make_data(50, 2)
    build_version(tmp_path, keys, values, version=3)
    build_version(tmp_path, keys, values + 1, version=3)
    d = dictfile.load_shard_dict(tmp_path / "out" / DICT / "3" / f"{DICT}_part0")
    np.testing.assert_array_equal(d.lookup(keys)[0], values + 1)


def test_cli_build(tmp_path, capsys):
    keys, values = make_data(300, 2)
    write_sequence_file(tmp_path / "in", keys, values)
    rc = cli.main(["cube", "build", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                   "--dict", DICT, "--shards", "2", "--version", "11"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["count"] == 300
    (tmp_path / "bad").write_bytes(b"SEQ\x06garbage")
    rc = cli.main(["cube", "build", "--input", str(tmp_path / "bad"), "--output", str(tmp_path / "out"),
                   "--dict", DICT, "--shards", "2", "--version", "12"])
    assert rc == 1 and not (tmp_path / "out" / DICT / "12").exists()


def test_build_record_round_trip_and_errors(tmp_path):
    keys, values = make_data(300, 2)
    res = build_version(tmp_path, keys, values, version=7, shard_num=2)
    vdir = Path(res.output_dir)
    assert BuildRecord.read(vdir) == res
    assert [s.tar for s in res.shards] == [shard_tar_name(DICT, 0), shard_tar_name(DICT, 1)]
    assert parse_shard_tar_name("http://h/cube/d/7/" + res.shards[1].tar) == (DICT, 1)
    assert parse_shard_tar_name("shard.tar") is None
    doc = json.loads((vdir / "build.json").read_text())
    del doc["shards"][1]["md5"]
    (vdir / "build.json").write_text(json.dumps(doc))
    with pytest.raises(BuildRecordError, match=r"build.json: invalid build record: shards\[1\].md5: Field required"):
        BuildRecord.read(vdir)
    doc["shards"].pop()
    (vdir / "build.json").write_text(json.dumps(doc))
    with pytest.raises(BuildRecordError, match=r"shards \[0\] are not 0..1"):
        BuildRecord.read(vdir / "build.json")
    (vdir / "build.json").write_text("{")
    with pytest.raises(BuildRecordError, match="cannot read the build record"):
        BuildRecord.read(vdir)


def test_a_shard_with_no_key_builds_and_loads(tmp_path):
    """A small version (few feasigns admitted) can leave a shard empty: its dict is written
    and loads as a table holding nothing."""
    from runtime.cube.views import VersionView

    keys = np.array([2, 4, 6], np.uint64)  # all on shard 0 of 2
    values = np.ones((3, 4), np.float32)
    res = build_version(tmp_path, keys, values, version=7, shard_num=2)
    assert res.count == 3
    empty = dictfile.load_shard_dict(tmp_path / "out" / DICT / "7" / f"{DICT}_part1")
    assert len(empty) == 0 and empty.values.shape == (0, 4)
    view = VersionView.of_base(empty.keys, empty.values, 7)
    vals, found = view.lookup(keys)
    assert len(view) == 0 and not found.any() and not vals.any()
