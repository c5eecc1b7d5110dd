"""A new shard count as a cube layout beside the serving one (issue 17), in-process:
the transfer lays the served chain out on the new layout while the old one keeps
serving untouched, holds what is published meanwhile, announces on ``/dict/info`` only
complete layouts (``DictInfo.version_for``), goes back to the old layout without
rebuilding; serving's ``VersionWatcher`` follows only a version laid out for its
topology's shard count.

Fake servers and real agents, as tests/cube/test_transfer.py (its ``Cluster`` is one
layout: the old and the new are two of them).
"""
from __future__ import annotations

import json

import pytest

from runtime.formats.dict_info import DictInfo
from runtime.serving.model import VersionWatcher
from tests.cube.test_transfer import Cluster, add_version, drain, make_transfer, served_chain_2shards
from tests.helpers import ThreadedApp

RELAYOUT = "relayout 2->3 shards"


@pytest.fixture
def gens(tmp_path):
    """The serving layout (2 shards x 2 replicas) and a new one (3 x 1, empty)."""
    old, new = Cluster(tmp_path / "g2"), Cluster(tmp_path / "g3", shards=3, replicas=1)
    yield old, new
    old.close()
    new.close()


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "donefile").mkdir(parents=True)
    return r


def seen(tr) -> tuple:
    i = tr.info()
    return i.version, i.served_shard_num, i.version_for(2), i.version_for(3)


def test_relayout_beside_the_serving_generation_holds_what_is_published(gens, root, tmp_path):
    old, new = gens
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


def test_back_to_the_previous_shard_count_mid_relayout(gens, root, tmp_path):
    old, new = gens
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


def test_a_relayout_that_cannot_be_rebuilt_lets_a_newer_base_through(gens, root, tmp_path):
    old, new = gens
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


def test_a_relayout_restarted_for_a_third_shard_count_ends_on_the_target(gens, root, tmp_path):
    old, new = gens
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
