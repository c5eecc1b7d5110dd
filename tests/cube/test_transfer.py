"""Cube transfer: donefile parsing, rollout barriers, abort, refusal, persisted state.

Runs in-process: 2 shards x 2 replicas of a real ``Agent`` (its Flask app served in a
thread) in front of ``FakeServer`` (tests/helpers.py), and a stub builder that
writes the builder's output layout (docs/contracts.md) so these tests do not depend on
the data plane.
"""
from __future__ import annotations

import hashlib
import json
import time
import tarfile
from pathlib import Path

import pytest

from runtime.cube.agent import Agent, create_app as agent_app
from runtime.cube.buildinfo import BuildRecord, ShardBuild, md5_name, part_name, shard_tar_name
from runtime.cube.transfer.service import Transfer
from runtime.cube.transfer.app import create_app
from runtime.formats.dict_info import DictInfo
from runtime.formats import donefile
from tests.helpers import FakeServer, ThreadedApp

DICT = "d"


def stub_build(inputs, output_dir, dict_name, shard_num, version, mode, base_version, bad_md5_shard=None):
    """Writes ``<out>/<dict>/<version>/{<dict>_part<i>/, .tar, .tar.md5, build.json}``."""
    vdir = Path(output_dir) / dict_name / str(version)
    vdir.mkdir(parents=True, exist_ok=True)
    payload = b"".join(Path(p).read_bytes() for p in inputs)
    shards = []
    for i in range(shard_num):
        part = vdir / part_name(dict_name, i)
        part.mkdir(exist_ok=True)
        (part / "data").write_bytes(payload + b"|%d|%d" % (i, version))
        # FakeServer checks it, as the real server checks a dict's meta
        (part / "meta.json").write_text(json.dumps({"shard": i, "shard_num": shard_num, "version": version}))
        tar = vdir / shard_tar_name(dict_name, i)
        with tarfile.open(tar, "w") as tf:
            tf.add(part, arcname=part.name)
        md5 = hashlib.md5(tar.read_bytes()).hexdigest()
        if i == bad_md5_shard:
            md5 = "f" * 32
        (vdir / md5_name(tar.name)).write_text(md5 + "\n")
        shards.append(ShardBuild(shard=i, dir=part.name, tar=tar.name, md5=md5, count=1,
                                 bytes=tar.stat().st_size, tar_bytes=tar.stat().st_size))
    BuildRecord(dict_name=dict_name, version=version, mode=mode, base_version=base_version,
                shard_num=shard_num, dim=2, count=len(payload), duplicates=0, input_records=len(payload),
                inputs=list(inputs), shards=shards).write(vdir)


class Cluster:
    """``shards`` x ``replicas`` (default 2 x 2) of FakeServer + Agent. ``servers``,
    ``agents`` are in topology order (shard-major)."""

    def __init__(self, tmp: Path, shards: int = 2, replicas: int = 2):
        self.tmp = tmp
        self.rep: dict[tuple[int, int], tuple[FakeServer, Agent, ThreadedApp]] = {}
        self.resize(shards, replicas)

    def resize(self, shards: int, replicas: int | None = None, keep_running: tuple = ()) -> None:
        """What ``pulumi up`` with new cubeShards/cubeReplicas does: when the shard count
        changes, every existing server restarts empty with the new ``--shard-num`` (but
        those in ``keep_running``, (shard, replica) pairs, which keep the old one and their
        version: a pod not restarted yet); the agents keep their state; missing replicas
        are added, surplus ones dropped; the topology is rewritten."""
        replicas = replicas or self.replicas
        for key in [k for k in self.rep if k[0] >= shards or k[1] >= replicas]:
            srv, _, app = self.rep.pop(key)
            app.close()
            srv.close()
        for (s, r), (srv, _, _) in self.rep.items():
            if srv.shard_num != shards and (s, r) not in keep_running:
                srv.restart(shard_num=shards)
        topo = {"dict_name": DICT, "shards": []}
        for s in range(shards):
            reps = []
            for r in range(replicas):
                if (s, r) not in self.rep:
                    srv = FakeServer(shard=s, shard_num=shards)
                    ag = Agent(srv.url, self.tmp / f"agent{s}{r}", load_timeout_s=10, poll_s=0.01)
                    self.rep[(s, r)] = (srv, ag, ThreadedApp(agent_app(ag)))
                srv, _, app = self.rep[(s, r)]
                reps.append({"server": "127.0.0.1:1", "http": srv.url, "agent": app.url})
            topo["shards"].append({"shard": s, "replicas": reps})
        self.shards, self.replicas, self.topology = shards, replicas, topo

    @property
    def servers(self) -> list[FakeServer]:
        return [self.rep[k][0] for k in sorted(self.rep)]

    @property
    def agents(self) -> list[Agent]:
        return [self.rep[k][1] for k in sorted(self.rep)]

    def versions(self):
        return [s.version for s in self.servers]

    def close(self):
        for srv, _, app in self.rep.values():
            app.close()
            srv.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "donefile").mkdir(parents=True)
    return r


def add_version(root: Path, vid: int, key: int, patch: bool = False, data: bytes | None = None) -> None:
    sparse = root / "versions" / str(vid) / "sparse"
    sparse.mkdir(parents=True, exist_ok=True)
    (sparse / "part-00000").write_bytes(data or b"v%d" % vid)
    (sparse / "_SUCCESS").write_bytes(b"")
    rec = donefile.DonefileRecord(id=vid, key=key, input=donefile.sparse_dir(vid))
    donefile.append(str(root), "patch" if patch else "base", rec)


def make_transfer(cluster, root, work, **kw) -> Transfer:
    kw.setdefault("build_fn", stub_build)
    kw.setdefault("phase_timeout_s", 20)
    kw.setdefault("retries", 2)
    kw.setdefault("rollout_backoff_s", 0.0)
    kw.setdefault("coalesce", False)  # these tests follow patches one by one: tests/cube/test_coalesce.py folds them
    return Transfer(cluster.topology, str(root), work, poll_interval_s=0.05, **kw)


# ------------------------------------------------------------------------- rollouts


def test_base_then_patch_and_malformed_lines(cluster, root, tmp_path):
    add_version(root, 100, 100)
    with open(root / "donefile" / "base.txt", "a") as f:
        f.write("garbage line\n")  # malformed: logged, skipped; the last *valid* line is the newest
    tr = make_transfer(cluster, root, tmp_path / "work")
    assert tr.info().version is None and tr.info().status == "empty"
    e = tr.poll_once()
    assert e["status"] == "finished", e
    assert cluster.versions() == [100] * 4
    assert set(e["phases"]) == {"Building", "Deploying", "Downloading", "Reloading", "Enabling"}
    # tars published under ROOT/cube/<dict>/<version>/
    assert (root / "cube" / DICT / "100" / f"{DICT}_part1.tar").exists()
    assert tr.poll_once() is None  # nothing new
    add_version(root, 101, 100, patch=True)
    add_version(root, 102, 100, patch=True)
    assert tr.poll_once()["version"] == 101
    assert tr.poll_once()["version"] == 102
    assert cluster.versions() == [102] * 4
    for s in cluster.servers:
        assert s.enables == [100, 101, 102]
    info = tr.info()
    assert (info.version, info.base_id, info.patch_id) == (102, 100, 102)
    assert (info.shard_num, info.replica_num, info.dim) == (2, 2, 2)
    # a newer base supersedes older ones; patches of the old base are not applied to it
    add_version(root, 200, 200)
    add_version(root, 300, 300)
    assert tr.poll_once()["version"] == 300
    assert tr.poll_once() is None
    assert cluster.versions() == [300] * 4
    # logged and counted once, not at every poll
    assert tr.metrics.registry.get_sample_value("elastic_ctr_transfer_donefile_malformed_lines_total") == 1


def test_restart_does_not_repeat_a_finished_rollout(cluster, root, tmp_path):
    add_version(root, 10, 10)
    add_version(root, 11, 10, patch=True)
    tr = make_transfer(cluster, root, tmp_path / "work")
    while tr.poll_once():
        pass
    assert cluster.versions() == [11] * 4
    tr2 = make_transfer(cluster, root, tmp_path / "work")  # "restarted": state from disk
    assert tr2.info().version == 11
    assert tr2.poll_once() is None
    for s in cluster.servers:
        assert s.enables == [10, 11]
    assert [h["version"] for h in tr2.history()] == [10, 11]


def test_interrupted_rollout_is_resumed_once(cluster, root, tmp_path):
    add_version(root, 20, 20)
    tr = make_transfer(cluster, root, tmp_path / "work")

    def crash(phase, plan):
        if phase == "Enabling":
            raise KeyboardInterrupt  # the process dies between Reloading and Enabling

    tr.after_phase = crash
    with pytest.raises(KeyboardInterrupt):
        tr.poll_once()
    state = json.loads((tmp_path / "work" / "transfer_state.json").read_text())
    assert state["current"]["version"] == 20 and state["current"]["phase"] == "Enabling"
    assert cluster.versions() == [None] * 4
    # as if the old process had switched shard 0's replicas before dying
    for ag in cluster.agents[:2]:
        assert ag.enable({"version": 20})[0] == 200
    tr2 = make_transfer(cluster, root, tmp_path / "work")
    assert tr2.info().status == "rolling_out"
    e = tr2.poll_once()
    assert e["status"] == "finished" and e["resumed"] and sorted(e["skipped"]) == [
        "shard0/replica0", "shard0/replica1"]
    assert cluster.versions() == [20] * 4
    for s in cluster.servers:
        assert s.enables == [20]  # nobody switched twice
    assert tr2.poll_once() is None


def test_failure_in_one_instance_aborts_and_old_version_serves(cluster, root, tmp_path):
    add_version(root, 1, 1)
    tr = make_transfer(cluster, root, tmp_path / "work", max_rollout_attempts=2)
    assert tr.poll_once()["status"] == "finished"
    add_version(root, 2, 2)
    cluster.servers[3].fail_load.add(2)  # shard 1 replica 1 cannot load version 2
    e = tr.poll_once()
    assert e["status"] == "failed" and "Reloading" in e["error"] and "shard1/replica1" in e["error"]
    assert cluster.versions() == [1] * 4  # nothing enabled: the barrier held
    assert all(s.enables == [1] for s in cluster.servers)
    assert all(s.unloads >= 1 for s in cluster.servers) and all(s.bg_version is None for s in cluster.servers)
    assert tr.info().version == 1 and tr.info().last_rollout.status == "failed"
    e = tr.poll_once()  # second and last attempt
    assert e["status"] == "failed" and e["given_up"]
    assert tr.poll_once() is None  # given up: not retried forever
    assert cluster.versions() == [1] * 4
    add_version(root, 3, 3)  # a newer base still goes out
    assert tr.poll_once()["status"] == "finished" and cluster.versions() == [3] * 4


def test_md5_mismatch_aborts_at_downloading(cluster, root, tmp_path):
    add_version(root, 1, 1)
    tr = make_transfer(cluster, root, tmp_path / "work")
    tr.poll_once()
    add_version(root, 2, 2)
    tr.build_fn = lambda *a: stub_build(*a, bad_md5_shard=1)
    e = tr.poll_once()
    assert e["status"] == "failed" and "Downloading" in e["error"] and "md5 mismatch" in e["error"]
    assert cluster.versions() == [1] * 4
    assert all(s.loads[-1].endswith("_part%d" % s.shard) for s in cluster.servers)


def test_delta_with_wrong_base_refused(cluster, root, tmp_path):
    add_version(root, 50, 50)
    tr = make_transfer(cluster, root, tmp_path / "work")
    tr.poll_once()
    add_version(root, 51, 49, patch=True)  # names a base that is not served
    add_version(root, 52, 50, patch=True)
    e = tr.poll_once()
    assert e["version"] == 52 and e["status"] == "finished"
    refused = [h for h in tr.history() if h["status"] == "refused"]
    assert [h["version"] for h in refused] == [51] and "not the served base" in refused[0]["error"]
    assert cluster.versions() == [52] * 4
    assert tr.poll_once() is None
    assert len([h for h in tr.history() if h["status"] == "refused"]) == 1  # recorded once


def test_missing_input_fails_building_and_transfer_keeps_running(cluster, root, tmp_path):
    donefile.append(str(root), "base", donefile.DonefileRecord(id=7, key=7, input="versions/7/nowhere"))
    tr = make_transfer(cluster, root, tmp_path / "work", max_rollout_attempts=1)
    e = tr.poll_once()
    assert e["status"] == "failed" and e["error"].startswith("Building") and "versions/7/nowhere" in e["error"]
    add_version(root, 8, 8)
    assert tr.poll_once()["status"] == "finished"


def test_failed_rollout_waits_for_its_backoff(cluster, root, tmp_path):
    add_version(root, 1, 1)
    cluster.servers[0].fail_load.add(1)
    tr = make_transfer(cluster, root, tmp_path / "work", rollout_backoff_s=0.5)
    assert tr.poll_once()["status"] == "failed"
    assert tr.poll_once() is None  # within the backoff: not retried yet
    cluster.servers[0].fail_load.clear()  # the replica recovers
    time.sleep(0.6)
    assert tr.poll_once()["status"] == "finished"
    assert cluster.versions() == [1] * 4


def test_reconcile_brings_a_restarted_instance_back(cluster, root, tmp_path):
    add_version(root, 1, 1)
    add_version(root, 2, 1, patch=True)
    add_version(root, 3, 1, patch=True)
    tr = make_transfer(cluster, root, tmp_path / "work")
    while tr.poll_once():
        pass
    assert tr.reconcile() == []  # all consistent
    s = cluster.servers[2]  # shard 1 replica 0 restarts empty
    s.version, s.lineage, s.enables = None, [], []
    assert tr.reconcile() == ["shard1/replica0"]
    assert s.version == 3 and s.enables == [1, 2, 3] and s.lineage == [1, 2, 3]
    assert cluster.versions() == [3] * 4
    assert all(x.enables == [1, 2, 3] for x in cluster.servers if x is not s)  # others untouched


def test_http_api(cluster, root, tmp_path):
    add_version(root, 5, 5)
    tr = make_transfer(cluster, root, tmp_path / "work")
    tr.poll_once()
    c = create_app(tr).test_client()
    info = c.get("/dict/info").json
    assert info["version"] == 5 and info["dict_name"] == DICT and info["status"] == "serving"
    assert DictInfo.from_json(info) == tr.info().model_copy(update={"last_poll": info["last_poll"]})
    rep = c.get("/instance/status").json
    assert rep["consistent"] and [i["version"] for i in rep["replicas"]] == [5] * 4
    hist = c.get("/dict/deploy/history").json["history"]
    assert hist[-1]["status"] == "finished" and hist[-1]["version"] == 5
    m = c.get("/metrics").data.decode()
    assert "elastic_ctr_transfer_served_version 5.0" in m
    assert 'elastic_ctr_transfer_rollouts_total{status="finished"} 1.0' in m


# ------------------------------------------------------------------------- resize



def test_dict_info_reader_names_the_url_and_the_field(cluster, root, tmp_path):
    """``fetch_dict_info`` reads what the transfer answers; a body that is not a
    ``DictInfo`` or a transfer that does not answer is a ``DictInfoError`` naming the URL
    (and the field); ``served_version`` is then None."""
    from flask import Flask, jsonify

    from runtime import proc
    from runtime.formats.dict_info import DictInfoError, fetch_dict_info, served_version

    add_version(root, 5, 5)
    tr = make_transfer(cluster, root, tmp_path / "work")
    tr.poll_once()
    good = ThreadedApp(create_app(tr))
    bad_app = Flask("bad")
    bad_app.get("/dict/info")(lambda: jsonify({"dict_name": DICT, "version": "five", "status": "serving"}))
    bad = ThreadedApp(bad_app)
    try:
        got = fetch_dict_info(good.url)
        assert got.version == 5 and got.dict_name == DICT and served_version(good.url) == 5
        with pytest.raises(DictInfoError) as e:
            fetch_dict_info(bad.url)
        msg = str(e.value)
        assert bad.url + "/dict/info" in msg and "version" in msg and "shard_num: Field required" in msg
        assert served_version(bad.url) is None
        nobody = f"http://127.0.0.1:{proc.free_ports(1)[0]}"
        with pytest.raises(DictInfoError, match=nobody + "/dict/info"):
            fetch_dict_info(nobody, timeout_s=1)
        assert served_version(nobody, timeout_s=1) is None
    finally:
        good.close()
        bad.close()

def served_chain_2shards(cluster, root, work) -> Transfer:
    """Base 10, patches 11 and 12 served on the 2-shard cluster."""
    add_version(root, 10, 10)
    add_version(root, 11, 10, patch=True)
    add_version(root, 12, 10, patch=True)
    tr = make_transfer(cluster, root, work)
    while tr.poll_once():
        pass
    assert cluster.versions() == [12] * 4
    assert tr.info().served_shard_num == 2
    return tr


def drain(tr: Transfer) -> list[dict]:
    out = []
    while (e := tr.poll_once()) is not None:
        out.append(e)
        assert len(out) < 20
    return out


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
