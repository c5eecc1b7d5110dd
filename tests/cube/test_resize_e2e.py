"""End to end resize: a 2-shard cube (processes on 127.0.0.1, ``LocalCubeCluster``) serves
a base and a patch; the whole cluster is then restarted with 3 shards, as ``pulumi up``
with a new ``cubeShards`` does (servers with ``--shard-num 3``, the transfer with the new
topology and the same work dir, the agents with theirs). Without anything new being
published, the transfer lays the served chain out for 3 shards, and every key is served
correctly through ``CubeClient`` over the new topology.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import requests

from tests.helpers import check_all, table_from_files, write_version

pytestmark = pytest.mark.slow

DIM = 4
N = 10_000
BASE, PATCH = 2001, 2002


def test_resize_relayouts_the_served_version(tmp_path):
    from runtime.local.cube import LocalCubeCluster
    from runtime.cube.client import CubeClient

    rng = np.random.default_rng(7)
    root, run = tmp_path / "root", tmp_path / "run"
    keys = rng.choice(1 << 40, N, replace=False).astype(np.uint64)
    values = rng.standard_normal((N, DIM)).astype(np.float32)
    with LocalCubeCluster(run, root, shards=2, replicas=1, poll_interval_s=0.1) as c2:
        expected = table_from_files(write_version(root, BASE, keys, values))
        c2.publish_version(BASE, BASE, dim=DIM, count=N)
        c2.wait_version(BASE, timeout_s=60)
        pk = np.concatenate([keys[:500], (rng.choice(1 << 40, 300, replace=False) + (1 << 41)).astype(np.uint64)])
        pv = rng.standard_normal((len(pk), DIM)).astype(np.float32)
        expected.update(table_from_files(write_version(root, PATCH, pk, pv, parts=1)))
        c2.publish_version(PATCH, BASE, patch=True, dim=DIM)
        c2.wait_version(PATCH, timeout_s=60)
        assert c2.info().served_shard_num == 2
    # everything stopped; restarted with 3 shards, same root, same work dirs
    with LocalCubeCluster(run, root, shards=3, replicas=1, poll_interval_s=0.1) as c3:
        deadline = time.monotonic() + 90
        info: dict = {}
        while time.monotonic() < deadline:
            c3.group.check()
            info = c3.info()
            if info.served_shard_num == 3 and info.relayout is None and info.version == PATCH:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"not re-laid out: {info}")
        assert (info.shard_num, info.base_id, info.patch_id) == (3, BASE, PATCH)
        hist = requests.get(f"{c3.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
        relayout = [(h["version"], h["status"]) for h in hist if h.get("reason") == "relayout 2->3 shards"]
        assert relayout == [(BASE, "finished"), (PATCH, "finished")]
        with CubeClient.from_topology(c3.topology, timeout_ms=2000) as client:
            check_all(client, expected, PATCH)
        assert (root / "cube" / "ctr_embedding" / f"{BASE}-3shards" / "ctr_embedding_part2.tar").exists()
