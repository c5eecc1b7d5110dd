"""A new shard count as a cube layout beside the serving one, in-process:
the transfer lays the served chain out on the new layout while the old one keeps
serving untouched, holds what is published meanwhile, announces on ``/dict/info`` only
complete layouts (``DictInfo.version_for``), goes back to the old layout without
rebuilding; serving's ``VersionWatcher`` follows only a version laid out for its
topology's shard count.

Fake servers and real agents (tests/cube/transfer_harness.py: its ``Cluster`` is one
layout; the old and the new are two of them). First, a resize within one layout: the
transfer relayouts the served chain on the servers restarted with the new shard count.
"""
from __future__ import annotations

import json
import time

import pytest

from runtime.formats.dict_info import DictInfo
from runtime.serving.model import VersionWatcher
from tests.cube.transfer_harness import DICT, Cluster, add_version, drain, make_transfer, served_chain_2shards
from tests.helpers import ThreadedApp

RELAYOUT = "relayout 2->3 shards"


@pytest.mark.parametrize("legacy_state", [False, True], ids=["state", "legacy-state"])
def test_resize_relayouts_the_served_chain(cluster, root, tmp_path, legacy_state):
    work = tmp_path / "work"
    served_chain_2shards(cluster, root, work)
    old_md5 = (root / "cube" / DICT / "10" / f"{DICT}_part0.tar.md5").read_text()
    if legacy_state:  # written before the served record held shard_num: the chain's md5s tell
        st = json.loads((work / "transfer_state.json").read_text())
        del st["served"]["shard_num"], st["relayout"]
        for link in st["served_chain"]:
            del link["input"], link["key"], link["model"], link["shard_num"]
        (work / "transfer_state.json").write_text(json.dumps(st))
    cluster.resize(4)  # shards 0-1 restart empty with --shard-num 4, agents keep their state
    assert cluster.versions() == [None] * 8
    tr = make_transfer(cluster, root, work)  # the transfer restarts with the new topology
    info = tr.info()
    assert (info.version, info.shard_num, info.served_shard_num) == (12, 4, 2)
    assert tr.reconcile() == []  # the served chain's tars are for 2 shards: no reconcile
    entries = drain(tr)
    assert [(e["version"], e["mode"], e["status"]) for e in entries] == [
        (10, "base", "finished"), (11, "delta", "finished"), (12, "delta", "finished")]
    assert {e["reason"] for e in entries} == {"relayout 2->4 shards"}
    assert [e["base_version"] for e in entries] == [None, 10, 11]
    assert all(e["shard_num"] == 4 for e in entries)
    assert cluster.versions() == [12] * 8
    for s in cluster.servers:  # every server (FakeServer checks the dict meta) loaded 4-shard dicts
        assert s.enables == [10, 11, 12] and s.lineage == [10, 11, 12] and s.shard_num == 4
    info = tr.info()
    assert (info.version, info.base_id, info.patch_id) == (12, 10, 12)
    assert (info.shard_num, info.served_shard_num, info.relayout) == (4, 4, None)
    assert info.status == "serving"
    # published beside the 2-shard tars of the same ids, which are untouched
    for v in (10, 11, 12):
        assert (root / "cube" / DICT / f"{v}-4shards" / f"{DICT}_part3.tar").exists()
    assert (root / "cube" / DICT / "10" / f"{DICT}_part0.tar.md5").read_text() == old_md5
    assert not (root / "cube" / DICT / "10" / f"{DICT}_part3.tar").exists()
    assert not list((work / "build").glob("relayout-*"))  # re-layout builds cleaned
    assert tr.poll_once() is None and tr.reconcile() == []
    # a restarted server is reconciled from the 4-shard tars
    cluster.servers[5].restart()
    assert tr.reconcile() == ["shard2/replica1"] and cluster.servers[5].version == 12
    # the next patch goes out on 4 shards
    add_version(root, 13, 10, patch=True)
    e = tr.poll_once()
    assert (e["version"], e["status"], e.get("reason")) == (13, "finished", None)
    assert cluster.versions() == [13] * 8


def test_no_relayout_when_the_shard_count_is_unchanged(cluster, root, tmp_path):
    work = tmp_path / "work"
    served_chain_2shards(cluster, root, work)
    n_hist = len(json.loads((work / "transfer_state.json").read_text())["history"])
    tr = make_transfer(cluster, root, work)  # restarted, same topology
    assert tr.info().relayout is None
    assert tr.poll_once() is None
    assert len(tr.history()) == n_hist
    for s in cluster.servers:
        assert s.enables == [10, 11, 12]


def test_more_replicas_are_reconciled_without_relayout(cluster, root, tmp_path):
    work = tmp_path / "work"
    served_chain_2shards(cluster, root, work)
    cluster.resize(2, replicas=3)
    tr = make_transfer(cluster, root, work)
    assert tr.poll_once() is None
    assert sorted(tr.reconcile()) == ["shard0/replica2", "shard1/replica2"]
    assert cluster.versions() == [12] * 6
    assert all(s.lineage == [10, 11, 12] for s in cluster.servers)


def test_relayout_waits_for_servers_to_restart_and_retries_failures(cluster, root, tmp_path):
    work = tmp_path / "work"
    add_version(root, 10, 10)
    tr = make_transfer(cluster, root, work)
    assert tr.poll_once()["status"] == "finished"
    # shard 1 replica 0 has not restarted yet: it still serves 10 laid out for 2 shards
    cluster.resize(4, keep_running=((1, 0),))
    stale = cluster.rep[(1, 0)][0]
    tr = make_transfer(cluster, root, work, max_rollout_attempts=1)
    add_version(root, 11, 10, patch=True)  # held back until the re-layout is done
    for _ in range(3):  # waits: no rollout, no attempt used
        assert tr.poll_once() is None
    assert tr.info().waiting_for == ["shard1/replica0"] and tr.info().relayout.done == 0
    assert tr.history()[-1]["version"] == 10 and "reason" not in tr.history()[-1]
    assert tr.reconcile() == []  # does not fight the re-layout
    assert all(s.enables == [] for s in cluster.servers if s is not stale)
    stale.restart(shard_num=4)  # the pod restarts with --shard-num 4
    cluster.servers[0].fail_load.add(10)  # and one replica fails: beyond max_rollout_attempts
    for _ in range(2):
        e = tr.poll_once()
        assert e["status"] == "failed" and e["reason"] == "relayout 2->4 shards" and not e["given_up"]
        assert "Reloading" in e["error"] and "shard0/replica0" in e["error"]
    assert all(s.enables == [] for s in cluster.servers)  # the barrier held
    cluster.servers[0].fail_load.clear()
    entries = drain(tr)
    assert [(e["version"], e["status"], e.get("reason")) for e in entries] == [
        (10, "finished", "relayout 2->4 shards"), (11, "finished", None)]
    assert cluster.versions() == [11] * 8 and tr.info().waiting_for == []
    assert all(s.enables == [10, 11] for s in cluster.servers)


def test_a_newer_base_waits_for_the_relayout(cluster, root, tmp_path):
    work = tmp_path / "work"
    served_chain_2shards(cluster, root, work)
    cluster.resize(3)
    tr = make_transfer(cluster, root, work)
    add_version(root, 20, 20)  # a newer base: held until the served chain is laid out for 3 shards
    entries = drain(tr)
    assert [(e["version"], e["status"], e.get("reason"), e["shard_num"]) for e in entries] == [
        (10, "finished", "relayout 2->3 shards", 3), (11, "finished", "relayout 2->3 shards", 3),
        (12, "finished", "relayout 2->3 shards", 3), (20, "finished", None, 3)]
    assert tr.poll_once() is None and tr.info().relayout is None
    assert cluster.versions() == [20] * 6


def test_reloading_keeps_a_replica_of_every_shard_out_of_the_wave(cluster, root, tmp_path):
    """Reloading (building the version's table, seconds of a server's CPU) never runs on
    both replicas of a shard at once, so lookups always have a replica that is not busy."""
    import threading

    from runtime.cube.transfer.agents import reload_waves
    from runtime.formats.topology import Replica

    tr = make_transfer(cluster, root, tmp_path / "work")
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()
    drive = tr.agents.drive

    def timed(rep, step, *a, **kw):
        t0 = time.monotonic()
        if step == "reload":
            time.sleep(0.2)  # long enough for overlapping calls to overlap
        drive(rep, step, *a, **kw)
        if step == "reload":
            with lock:
                spans[rep.name] = (t0, time.monotonic())

    tr.agents.drive = timed
    add_version(root, 100, 100)
    assert tr.poll_once()["status"] == "finished"
    assert cluster.versions() == [100] * 4 and len(spans) == 4
    for shard in (0, 1):
        a, b = spans[f"shard{shard}/replica0"], spans[f"shard{shard}/replica1"]
        assert a[1] <= b[0], (shard, a, b)  # replica 1 starts after replica 0 ended
    # the two shards' first replicas did reload together (one wave, not one at a time)
    r0, r1 = spans["shard0/replica0"], spans["shard1/replica0"]
    assert max(r0[0], r1[0]) < min(r0[1], r1[1])

    def reps(spec):
        return [Replica(shard=s, replica=r, server="s", http="h", agent="a") for s, r in spec]

    waves = reload_waves(reps([(0, 2), (0, 0), (0, 1), (1, 0)]))
    assert [[(i.shard, i.replica) for i in w] for w in waves] == [[(0, 0), (0, 1), (1, 0)], [(0, 2)]]
    assert len(reload_waves(reps([(0, 0), (1, 0)]))) == 1


@pytest.fixture
def layouts(tmp_path):
    """The serving layout (2 shards x 2 replicas) and a new one (3 x 1, empty)."""
    old, new = Cluster(tmp_path / "g2"), Cluster(tmp_path / "g3", shards=3, replicas=1)
    yield old, new
    old.close()
    new.close()


def seen(tr) -> tuple:
    i = tr.info()
    return i.version, i.served_shard_num, i.version_for(2), i.version_for(3)


def test_relayout_beside_the_serving_layout_holds_what_is_published(layouts, root, tmp_path):
    old, new = layouts
    work = tmp_path / "work"
    served_chain_2shards(old, root, work)  # base 10, patches 11, 12 on the old layout
    old_enables = [list(s.enables) for s in old.servers]
    tr = make_transfer(new, root, work)  # the transfer restarted on the new layout's topology
    assert seen(tr) == (12, 2, 12, None)
    add_version(root, 13, 10, patch=True)  # published during the switch: held
    views = []
    for _ in range(3):
        e = tr.poll_once()
        assert (e["status"], e.get("reason"), e["shard_num"]) == ("finished", RELAYOUT, 3)
        views.append((e["version"],) + seen(tr))
    # the links in between are never announced: the old layout's version until the last one
    assert views == [(10, 12, 2, 12, None), (11, 12, 2, 12, None), (12, 12, 3, None, 12)]
    assert tr.info().relayout is None and new.versions() == [12] * 3
    e = tr.poll_once()  # the held patch, on the new layout only
    assert (e["version"], e["status"], e.get("reason"), e["shard_num"]) == (13, "finished", None, 3)
    assert seen(tr) == (13, 3, None, 13)
    assert new.versions() == [13] * 3 and all(s.lineage == [10, 11, 12, 13] for s in new.servers)
    # the old layout was never touched: it still serves 12, as its serving pods expect
    assert old.versions() == [12] * 4 and [s.enables for s in old.servers] == old_enables
    assert tr.poll_once() is None


def test_back_to_the_previous_shard_count_mid_relayout(layouts, root, tmp_path):
    old, new = layouts
    work = tmp_path / "work"
    served_chain_2shards(old, root, work)
    old_enables = [list(s.enables) for s in old.servers]
    tr = make_transfer(new, root, work)
    assert tr.poll_once()["reason"] == RELAYOUT  # base 10 laid out on the new layout
    state = json.loads((work / "transfer_state.json").read_text())
    assert state["relayout"]["before"]["version"] == 12 and state["relayout"]["before"]["shard_num"] == 2
    tr = make_transfer(old, root, work)  # `pulumi config set cubeShards 2` again
    assert tr.poll_once() is None  # nothing rebuilt: the old layout serves 12 as it did
    assert seen(tr) == (12, 2, 12, None) and tr.info().relayout is None
    assert [s.enables for s in old.servers] == old_enables
    old.servers[1].restart()  # a restarted old-layout server is brought back from the 2-shard tars
    assert tr.reconcile() == ["shard0/replica1"] and old.versions() == [12] * 4
    add_version(root, 13, 10, patch=True)
    assert drain(tr)[0]["version"] == 13 and old.versions() == [13] * 4


def test_version_for_needs_the_layout_of_the_readers_shard_count():
    def info(**kw) -> DictInfo:
        return DictInfo.from_json({"dict_name": "d", "shard_num": 3, "replica_num": 1, "status": "serving", **kw})

    assert info(version=7, served_shard_num=3).version_for(3) == 7
    assert info(version=7, served_shard_num=2).version_for(3) is None
    assert info(version=7, served_shard_num=2).version_for(2) == 7
    assert info(version=7).version_for(5) == 7  # a transfer that does not say: taken at its word
    assert info().version_for(3) is None
    with pytest.raises(ValueError, match="shard_num"):
        info(version=7).version_for(0)


class _Model:
    def __init__(self, version: int):
        self.version = version


def test_watcher_follows_only_a_version_laid_out_for_its_shard_count(tmp_path):
    from flask import Flask

    body = {"dict_name": "d", "shard_num": 3, "replica_num": 1, "status": "serving", "version": 12,
            "served_shard_num": 2}
    app = Flask("fake-transfer")
    app.get("/dict/info")(lambda: body)
    srv = ThreadedApp(app)
    probed = []
    try:
        def watcher(n):
            w = VersionWatcher(str(tmp_path), srv.url, tmp_path / f"w{n}", shard_num=n,
                               probe=lambda v: probed.append((n, v)))
            w.load = _Model  # the dense model is not what is tested here
            return w

        w2, w3 = watcher(2), watcher(3)
        assert w2.poll_once() and w2.current.version == 12
        assert not w3.poll_once() and w3.current is None  # the new layout is not laid out yet: not ready
        assert "laid out for 2 shards" in w3.last_error and "has 3" in w3.last_error
        body.update(version=13, served_shard_num=3)  # laid out on 3 shards, and a newer patch
        assert not w2.poll_once() and w2.current.version == 12  # the old pod keeps what it serves
        assert w3.poll_once() and w3.current.version == 13
        assert probed == [(2, 12), (3, 13)]
        with pytest.raises(ValueError, match="shard_num"):
            VersionWatcher(str(tmp_path), srv.url, tmp_path / "w0", shard_num=0)
    finally:
        srv.close()


def test_a_relayout_that_cannot_be_rebuilt_lets_a_newer_base_through(layouts, root, tmp_path):
    old, new = layouts
    work = tmp_path / "work"
    served_chain_2shards(old, root, work)
    # the chain's inputs are gone (retention): links without recorded inputs, no patch lines
    st = json.loads((work / "transfer_state.json").read_text())
    for link in st["served_chain"]:
        link.pop("input", None)
    (work / "transfer_state.json").write_text(json.dumps(st))
    (root / "donefile" / "patch.txt").write_text("")
    tr = make_transfer(new, root, work)
    assert tr.poll_once() is None
    info = tr.info()
    assert info.relayout.given_up and "no input" in info.relayout.error
    assert seen(tr) == (12, 2, 12, None)  # the old layout still serves 12; nothing on 3 shards
    add_version(root, 20, 20)
    e = tr.poll_once()
    assert (e["version"], e["status"], e.get("reason"), e["shard_num"]) == (20, "finished", None, 3)
    assert seen(tr) == (20, 3, None, 20) and tr.info().relayout is None
    assert new.versions() == [20] * 3 and old.versions() == [12] * 4


def test_a_relayout_restarted_for_a_third_shard_count_ends_on_the_target(layouts, root, tmp_path):
    old, new = layouts
    work = tmp_path / "work"
    served_chain_2shards(old, root, work)
    tr = make_transfer(new, root, work)
    assert tr.poll_once()["reason"] == RELAYOUT  # base 10 on 3 shards, then cubeShards 4 before it ends
    g4 = Cluster(tmp_path / "g4", shards=4, replicas=1)
    try:
        tr = make_transfer(g4, root, work)
        entries = drain(tr)
        assert [(e["version"], e["reason"]) for e in entries] == [(v, "relayout 2->4 shards") for v in (10, 11, 12)]
        assert seen(tr)[:2] == (12, 4) and tr.info().relayout is None and g4.versions() == [12] * 4
        assert old.versions() == [12] * 4
    finally:
        g4.close()
