"""End to end: transfer + 2 shards x 2 replicas (cube server + agent each) + file server,
as processes on 127.0.0.1 (``runtime.local.cube.LocalCubeCluster``).

The transfer reads ROOT through the file server (JSON listing, token PUT of the shard
tars); agents download the tars over HTTP. Rolls out a base, then a patch, and checks
every key's value through ``CubeClient`` against the source SequenceFiles; then rolls a
new base out while a client seeks continuously, and checks zero errors and that every
batch is exactly one version's values.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.helpers import check_all, table_from_files, write_version

pytestmark = pytest.mark.slow

DIM = 4
N = 20_000
BASE1, PATCH1, BASE2 = 1001, 1002, 1003


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from runtime.local.cube import LocalCubeCluster

    base = tmp_path_factory.mktemp("cube_e2e")
    with LocalCubeCluster(base / "run", base / "root", shards=2, replicas=2, poll_interval_s=0.1) as c:
        yield c


def test_base_then_patch_every_key(cluster):
    from runtime.cube.client import CubeClient

    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, N, replace=False).astype(np.uint64)
    values = rng.standard_normal((N, DIM)).astype(np.float32)
    base_files = write_version(cluster.root, BASE1, keys, values)
    cluster.publish_version(BASE1, BASE1, dim=DIM, count=N)
    cluster.wait_version(BASE1, timeout_s=120)
    expected = table_from_files(base_files)
    assert len(expected) == N
    with CubeClient.from_topology(cluster.topology, timeout_ms=2000) as client:
        check_all(client, expected, BASE1)
        # the patch: 3000 changed keys and 1000 new ones
        changed = keys[rng.choice(N, 3000, replace=False)]
        new = (rng.choice(1 << 40, 1000, replace=False) + (1 << 41)).astype(np.uint64)
        pk = np.concatenate([changed, new])
        pv = rng.standard_normal((len(pk), DIM)).astype(np.float32)
        patch_files = write_version(cluster.root, PATCH1, pk, pv, parts=1)
        cluster.publish_version(PATCH1, BASE1, patch=True, dim=DIM)
        cluster.wait_version(PATCH1, timeout_s=120)
        expected.update(table_from_files(patch_files))
        assert len(expected) == N + 1000
        check_all(client, expected, PATCH1)
    info = cluster.info()
    assert (info.version, info.base_id, info.patch_id) == (PATCH1, BASE1, PATCH1)


def test_rollout_under_continuous_seeks(cluster):
    from runtime.cube.client import CubeClient

    assert cluster.info().version == PATCH1  # after the previous test
    with CubeClient.from_topology(cluster.topology, timeout_ms=2000) as client:
        # what PATCH1 serves, read back once (checked key by key by the previous test)
        keys = np.concatenate([np.fromiter(table_from_files(sorted((cluster.root / "versions" / str(v) / "sparse").iterdir())).keys(), np.uint64)
                               for v in (BASE1, PATCH1)])
        keys = np.unique(keys)
        old = client.seek(keys)
        assert old.version == PATCH1 and old.found.all()
        rng = np.random.default_rng(1)
        new_values = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        write_version(cluster.root, BASE2, keys, new_values)
        expected = {PATCH1: old.values, BASE2: new_values}

        stop = threading.Event()
        stats = {"batches": 0, "errors": [], "mixed": 0, "versions": set()}

        def seeker():
            r = np.random.default_rng(2)
            while not stop.is_set():
                idx = r.choice(len(keys), 500, replace=False)
                try:
                    res = client.seek(keys[idx])
                except Exception as exc:  # noqa: BLE001 - counted, the test fails on any
                    stats["errors"].append(repr(exc))
                    continue
                stats["batches"] += 1
                stats["versions"].add(res.version)
                want = expected.get(res.version)
                if want is None or not res.found.all() or not np.array_equal(res.values, want[idx]):
                    stats["mixed"] += 1

        t = threading.Thread(target=seeker, daemon=True)
        t.start()
        time.sleep(0.3)
        cluster.publish_version(BASE2, BASE2, dim=DIM, count=len(keys))
        cluster.wait_version(BASE2, timeout_s=120)
        time.sleep(0.3)
        stop.set()
        t.join(10)
    assert stats["errors"] == []
    assert stats["mixed"] == 0, f"{stats['mixed']} of {stats['batches']} batches mixed versions"
    assert stats["versions"] == {PATCH1, BASE2}
    assert stats["batches"] > 20


def test_bad_version_and_restart_keep_serving(cluster):
    import requests

    from runtime.cube.client import CubeClient

    assert cluster.info().version == BASE2  # after the previous test
    with open(cluster.root / "donefile" / "base.txt", "a") as f:
        f.write("{not json\n")  # malformed: logged and skipped
    # a version whose SequenceFile is truncated: Building fails, nothing is published
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 40, 5000, replace=False).astype(np.uint64)
    files = write_version(cluster.root, 1004, keys, np.ones((5000, DIM), np.float32), parts=1)
    files[0].write_bytes(files[0].read_bytes()[:-7])
    cluster.publish_version(1004, 1004, dim=DIM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = cluster.info().last_rollout
        if last and last.version == 1004:
            break
        time.sleep(0.1)
    assert last.status == "failed" and "Building" in last.error and "part-00000" in last.error
    assert not (cluster.root / "cube" / "ctr_embedding" / "1004").exists()
    with CubeClient.from_topology(cluster.topology, timeout_ms=2000) as client:
        assert client.seek(keys[:10]).version == BASE2
    hist = requests.get(f"{cluster.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
    finished = [h["version"] for h in hist if h["status"] == "finished"]
    assert finished == [BASE1, PATCH1, BASE2]

    # a restarted transfer resumes from its state: nothing redeployed, the same version served
    cluster.restart_transfer()
    assert cluster.info().version == BASE2
    time.sleep(1.0)  # ~10 polls
    hist = requests.get(f"{cluster.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
    assert [h["version"] for h in hist if h["status"] == "finished"] == finished
    rep = requests.get(f"{cluster.transfer_url}/instance/status", timeout=5).json()
    assert rep["consistent"] and {i["version"] for i in rep["replicas"]} == {BASE2}
    # and it still rolls out what comes next
    k2 = rng.choice(1 << 40, 3000, replace=False).astype(np.uint64)
    v2 = rng.standard_normal((3000, DIM)).astype(np.float32)
    write_version(cluster.root, 1005, k2, v2)
    cluster.publish_version(1005, 1005, dim=DIM)
    cluster.wait_version(1005, timeout_s=60)
    with CubeClient.from_topology(cluster.topology, timeout_ms=2000) as client:
        res = client.seek(k2)
        assert res.version == 1005 and res.found.all()
        np.testing.assert_array_equal(res.values, v2)
