"""Cube transfer: donefile parsing, rollout barriers, abort, refusal, persisted state.

Runs in-process against the cube of tests/cube/transfer_harness.py: 2 shards x 2 replicas
of a real ``Agent`` in front of ``FakeServer``, and a stub builder.
"""
from __future__ import annotations

import json
import time

import pytest

from runtime.cube.transfer.app import create_app
from runtime.formats.dict_info import DictInfo
from runtime.formats import donefile
from tests.cube.transfer_harness import DICT, add_version, make_transfer, stub_build
from tests.helpers import ThreadedApp, refusing_ports


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


def test_failure_in_one_replica_aborts_and_old_version_serves(cluster, root, tmp_path):
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


def test_reconcile_brings_a_restarted_replica_back(cluster, root, tmp_path):
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
        with refusing_ports(1) as (port,):
            nobody = f"http://127.0.0.1:{port}"
            with pytest.raises(DictInfoError, match=nobody + "/dict/info"):
                fetch_dict_info(nobody, timeout_s=1)
            assert served_version(nobody, timeout_s=1) is None
    finally:
        good.close()
        bad.close()
