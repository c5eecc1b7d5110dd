"""Bounded lag at the transfer (runtime.cube.transfer.coalesce): patches queued behind a
rollout go out as one, the newest row winning; ``coalesce=False`` keeps one per patch.

In-process with the stub builder of tests/cube/test_transfer.py (what the build is given),
and at process level with the local cube (every key's value served after a coalesced
rollout equals the base with the patches applied one by one)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from runtime.cube.transfer import coalesce
from runtime.cube.transfer.state import Phase, Plan
from runtime.formats import donefile
from tests.cube.transfer_harness import add_version, make_transfer


def _recording(calls):
    from tests.cube.transfer_harness import stub_build

    def build(inputs, output_dir, dict_name, shard_num, version, mode, base_version):
        calls.append((version, mode, base_version, [os.path.basename(os.path.dirname(i)) for i in inputs]))
        return stub_build(inputs, output_dir, dict_name, shard_num, version, mode, base_version)

    return build


def test_queued_patches_go_out_as_one_rollout(cluster, root, tmp_path):
    calls = []
    add_version(root, 100, 100)
    tr = make_transfer(cluster, root, tmp_path / "work", build_fn=_recording(calls), coalesce=True)
    assert tr.poll_once()["version"] == 100
    for v in (101, 102, 103):
        add_version(root, v, 100, patch=True)
    e = tr.poll_once()
    assert (e["status"], e["version"], e["coalesced"], e["base_version"]) == ("finished", 103, [101, 102], 100)
    assert tr.poll_once() is None  # nothing left: 101 and 102 are in 103's rollout
    # the build read every folded patch's parts, oldest first (the newest row wins)
    assert calls[-1] == (103, "delta", 100, ["sparse", "sparse", "sparse"])
    assert [p.split(os.sep)[-3] for p in _inputs(tmp_path, 103)] == ["101", "102", "103"]
    assert cluster.versions() == [103] * 4
    for s in cluster.servers:
        assert s.enables == [100, 103]
    info = tr.info()
    assert (info.version, info.patch_id, info.last_rollout.coalesced) == (103, 103, [101, 102])
    assert tr.state.served_chain[-1].coalesced == [101, 102]
    # one patch queued alone: an ordinary rollout
    add_version(root, 104, 100, patch=True)
    e = tr.poll_once()
    assert e["version"] == 104 and "coalesced" not in e and tr.info().last_rollout.coalesced == []


def _inputs(tmp_path, version):
    from runtime.cube.buildinfo import BuildRecord

    return BuildRecord.read(tmp_path / "work" / "build" / "d" / str(version)).inputs


def test_no_coalesce_rolls_every_patch_out(cluster, root, tmp_path):
    add_version(root, 100, 100)
    for v in (101, 102):
        add_version(root, v, 100, patch=True)
    tr = make_transfer(cluster, root, tmp_path / "work", coalesce=False)
    assert [tr.poll_once()["version"] for _ in range(3)] == [100, 101, 102]
    for s in cluster.servers:
        assert s.enables == [100, 101, 102]


def _rec(vid, key):
    return donefile.DonefileRecord(id=vid, key=key, input=donefile.sparse_dir(vid), model=donefile.dense_dir(vid))


def _plan(vid, key, **kw):
    return Plan(version=vid, key=key, mode="delta", base_version=key, input=donefile.sparse_dir(vid), seen=0.0, **kw)


def test_widen_stops_at_a_given_up_patch_and_leaves_other_plans_alone():
    lines = [_rec(5, 1), _rec(6, 1), _rec(7, 2), _rec(8, 1), _rec(9, 1)]
    wide = coalesce.widen(_plan(5, 1), lines, 1, 1, set(), {}, 0.0)
    assert (wide.version, wide.coalesced, wide.coalesced_inputs, wide.model) == (
        9, [5, 6, 8], ["versions/5/sparse", "versions/6/sparse", "versions/8/sparse"], "versions/9/dense")
    assert coalesce.widen(_plan(5, 1), lines, 1, 1, {8}, {}, 0.0).coalesced == [5]
    assert coalesce.widen(_plan(5, 1), lines, 1, 1, {6}, {}, 0.0).coalesced == []  # nothing to fold
    # a widened rollout that failed waits for its backoff
    assert coalesce.widen(_plan(5, 1), lines, 1, 1, set(), {"9": 100.0}, 50.0) is None
    for p in (_plan(5, 1, phase=Phase.RELOADING), _plan(5, 1, reason="relayout 2->3 shards"),
              Plan(version=5, key=5, mode="base", input="x", seen=0.0), None):
        assert coalesce.widen(p, lines, 1, 1, set(), {}, 0.0) is p


def test_fold_owns_the_rule():
    newest, ids, inputs = donefile.fold([_rec(5, 1), _rec(6, 1)])
    assert (newest.id, ids, inputs) == (6, [5], ["versions/5/sparse", "versions/6/sparse"])
    with pytest.raises(ValueError, match="different bases"):
        donefile.fold([_rec(5, 1), _rec(6, 2)])
    with pytest.raises(ValueError, match="not increasing"):
        donefile.fold([_rec(6, 1), _rec(5, 1)])
    with pytest.raises(ValueError, match="no patch line"):
        donefile.fold([])


@pytest.mark.slow
def test_coalesced_rollout_serves_the_patches_applied_in_order(tmp_path):
    """Process level: 2 shards x 2 replicas; three patches whose keys overlap land at once
    (one donefile write); one rollout serves every key as base + patch 1 + 2 + 3."""
    from runtime.cube.client import CubeClient
    from runtime.local.cube import LocalCubeCluster
    from tests.helpers import check_all, table_from_files, write_version

    dim, n = 4, 20_000
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 40, n, replace=False).astype(np.uint64)
    with LocalCubeCluster(tmp_path / "run", tmp_path / "root", shards=2, replicas=2, poll_interval_s=0.1) as c:
        expected = table_from_files(write_version(c.root, 1, keys, rng.standard_normal((n, dim)).astype(np.float32)))
        c.publish_version(1, 1, dim=dim, count=n)
        c.wait_version(1, timeout_s=120)
        lines = []
        for vid in (2, 3, 4):  # each rewrites 3000 keys (overlapping the others') and adds 500
            pk = np.concatenate([keys[rng.choice(n, 3000, replace=False)],
                                 (rng.choice(1 << 30, 500, replace=False) + (vid << 40)).astype(np.uint64)])
            files = write_version(c.root, vid, pk, rng.standard_normal((len(pk), dim)).astype(np.float32), parts=1)
            expected.update(table_from_files(files))
            lines.append(donefile.patch_record(vid, 1, dim).to_line())
        tmp = c.root / "donefile" / ".patch.txt.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, c.root / "donefile" / "patch.txt")  # the three lines appear at once
        c.wait_version(4, timeout_s=120)
        info = c.info()
        assert (info.version, info.last_rollout.status, info.last_rollout.coalesced) == (4, "finished", [2, 3])
        with CubeClient.from_topology(c.topology, timeout_ms=2000) as client:
            check_all(client, expected, 4)
