"""The topology document: one writer shape, one reader, errors naming the field."""
from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.formats.topology import Topology, TopologyError, shard_of, shard_rows


def _doc(shards=2, replicas=2):
    return Topology.build("d", [[(f"h{s}{r}:8900", f"http://h{s}{r}:8901", f"http://h{s}{r}:8902/")
                                 for r in range(replicas)] for s in range(shards)])


def test_round_trip(tmp_path):
    t = _doc()
    path = t.write(tmp_path / "topology.json")
    again = Topology.load(path)
    assert again == t and again.shard_num == 2
    assert again.servers() == [["h00:8900", "h01:8900"], ["h10:8900", "h11:8900"]]
    assert [i.name for i in again.all_replicas()] == ["shard0/replica0", "shard0/replica1",
                                                  "shard1/replica0", "shard1/replica1"]
    assert again.shards[0].replicas[0].agent == "http://h00:8902"  # trailing slash dropped
    assert t.to_json() == again.to_json() and t.checksum() == again.checksum()


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["shards"][0]["replicas"][0].pop("agent"), r"shards\[0\].replicas\[0\].agent: Field required"),
    (lambda d: d["shards"][1].__setitem__("shard", 5), "shard order: entry 1 is shard 5"),
    (lambda d: d["shards"][0]["replicas"][1].__setitem__("server", "nohost"), "is not host:port"),
    (lambda d: d["shards"][0]["replicas"][1].__setitem__("http", "h:1"), "is not an http"),
    (lambda d: d["shards"][0].__setitem__("replicas", []), "at least 1 item"),
    (lambda d: d.__setitem__("shards", []), "at least 1 item"),
    (lambda d: d.__setitem__("extra", 1), "extra: Extra inputs are not permitted"),
])
def test_invalid_documents_are_named(mutate, match):
    doc = json.loads(_doc().to_json())
    mutate(doc)
    with pytest.raises(TopologyError, match=match):
        Topology.load(doc)


def test_unreadable_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{")
    with pytest.raises(TopologyError, match=str(p)):
        Topology.load(p)


@pytest.mark.parametrize("shard_num", [1, 2, 3, 16, 17, 40, 64])
def test_shard_of_and_rows(shard_num):
    keys = np.random.default_rng(0).integers(0, 2**64, size=2000, dtype=np.uint64)
    keys[:3] = [0, 2**64 - 1, shard_num]
    sh = shard_of(keys, shard_num)
    assert sh.dtype == np.int64
    assert sh.tolist() == [int(k) % shard_num for k in keys.tolist()]
    rows = shard_rows(keys, shard_num)
    assert len(rows) == shard_num
    for s, r in enumerate(rows):
        np.testing.assert_array_equal(r, np.flatnonzero(sh == s))
    with pytest.raises(ValueError, match="shard_num"):
        shard_of(keys, 0)
