"""Cube client while a resize brings replicas through the served chain: a
replica added empty, or restarted, is driven by the transfer's reconcile through the
base and each patch, so for a while it serves an older link than its shard's other
replica. Unpinned lookups must still answer from one version for the whole batch, and a
version-pinned probe (``CubeClient.probe``) asks every shard, skipping replicas that do
not hold the version."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.cube.client import CubeClient, CubeVersionUnavailable
from runtime.formats.topology import Topology
from tests.helpers import build_version, load_and_enable, make_data, shard_dir, start_server


@pytest.fixture
def lagging(tmp_path):
    """3 shards x 2 replicas serving 102 (101 previous), but one replica of shards 0 and 1
    lags, holding only base 100: shard 0's replica 1 and shard 1's replica 0, so that every
    round-robin round meets one of them (no version common to every shard's answer)."""
    keys, values = make_data(3000, 3, seed=5)
    builds = {v: build_version(tmp_path, keys, values + (v - 100), version=v, shard_num=3) for v in (100, 101, 102)}
    servers = [[start_server(s, 3) for _ in range(2)] for s in range(3)]
    chains = {(0, 1): (100,), (1, 0): (100,)}
    for s in range(3):
        for r in range(2):
            for v in chains.get((s, r), (100, 101, 102)):
                load_and_enable(servers[s][r], shard_dir(builds[v], s), v)
    topo = Topology.build("emb", [[(f"127.0.0.1:{x.port}", f"http://127.0.0.1:{x.http_port}", "http://127.0.0.1:9")
                                   for x in reps] for reps in servers])
    yield servers, topo, keys, values
    for reps in servers:
        for x in reps:
            x.stop()


def test_unpinned_lookups_answer_one_version_while_replicas_lag(lagging):
    _, topo, keys, values = lagging
    with CubeClient.from_topology(topo, timeout_ms=2000) as c:
        seen = set()
        for i in range(40):  # round-robin meets every combination of lagging and current replicas
            k = keys[i * 50:(i + 1) * 50]
            res = c.seek(k)
            assert res.found.all()
            np.testing.assert_array_equal(res.values, values[i * 50:(i + 1) * 50] + (res.version - 100))
            seen.add(res.version)
        assert 102 in seen


def test_probe_asks_every_shard_for_the_version(lagging):
    _, topo, _, _ = lagging
    with CubeClient.from_topology(topo, timeout_ms=2000) as c:
        for _ in range(4):
            assert c.probe(102).version == 102  # the lagging replicas are skipped for the current ones
        assert c.probe(101).version == 101  # every shard holds it on a current replica (previous)
        with pytest.raises(CubeVersionUnavailable, match=r"shard\(s\) \[2\]"):
            c.probe(100)  # shards 0 and 1 hold it on their lagging replica; shard 2 nowhere
