"""runtime.tracking against a real ``mlflow server`` on loopback (tests/tracking/conftest.py):
what a continuous job logs equals its summary line partition by partition, a resumed job
continues its run, a server that goes away mid-job costs a warning and nothing of the
model, and a tracker never blocks its caller."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from runtime import tracking
from runtime.formats import partitions
from runtime.trainer import generator
from tests.trainer.test_online import START, _chain, _run, _summary


def _client(server):
    import mlflow

    return mlflow.MlflowClient(server.url)


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_no_uri_is_a_null_tracker_and_imports_nothing(monkeypatch):
    monkeypatch.delenv(tracking.URI_ENV, raising=False)
    tr = tracking.start(None, "x")
    assert isinstance(tr, tracking.NullTracker) and tr.close() == 0
    monkeypatch.setenv(tracking.URI_ENV, "http://127.0.0.1:1")
    assert tracking.tracking_uri() == "http://127.0.0.1:1"
    assert tracking.tracking_uri("file:/x") == "file:/x"


def test_tracker_logs_params_metrics_tags_and_artifact(mlflow_server, tmp_path):
    rfile = tracking.RunIdFile(str(tmp_path), "t")
    tr = tracking.Tracker(mlflow_server.url, "unit", tags={"elastic_ctr.trainer_id": 0}, run_id_file=rfile)
    tr.log_params({"lr": 0.01, "layers": "8,4"})
    for i in range(3):
        tr.log_metrics({"auc": 0.5 + i / 10, "skipped": None}, step=i)
    tr.set_tags({"version.7.kind": "base"})
    tr.log_dict({"id": 7}, "versions/7.json")
    assert tr.wait_idle(60) and tr.close() == 0
    c = _client(mlflow_server)
    run = c.get_run(tr.run_id)
    assert run.data.params == {"lr": "0.01", "layers": "8,4"}
    assert run.data.tags["version.7.kind"] == "base" and run.data.tags["elastic_ctr.trainer_id"] == "0"
    assert "skipped" not in run.data.metrics and run.info.status == "FINISHED"
    assert _history(c, tr.run_id, "auc") == pytest.approx({0: 0.5, 1: 0.6, 2: 0.7})
    assert [f.path for f in c.list_artifacts(tr.run_id, "versions")] == ["versions/7.json"]
    # a second tracker with the same run id file continues the run
    again = tracking.Tracker(mlflow_server.url, "unit", run_id_file=rfile)
    again.log_metrics({"auc": 0.9}, step=3)
    assert again.wait_idle(60) and again.close() == 0
    assert again.run_id == tr.run_id and _history(c, tr.run_id, "auc")[3] == pytest.approx(0.9)
    # a changed param is refused by the server: dropped with a count, the rest still goes
    again = tracking.Tracker(mlflow_server.url, "unit", run_id_file=rfile)
    again.log_params({"lr": 0.5})
    again.log_metrics({"auc": 0.95}, step=4)
    again.wait_idle(60)
    assert again.close() == 1 and _history(c, tr.run_id, "auc")[4] == pytest.approx(0.95)


def test_run_id_file_stays_where_it_was_named_when_the_cwd_moves(tmp_path, monkeypatch):
    """A relative --state-dir: the tracker's thread writes the file while a pass runs in a
    scratch working directory; the file must land under the state dir all the same."""
    monkeypatch.chdir(tmp_path)
    rfile = tracking.RunIdFile("state", "trainer-0")
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(tmp_path / "scratch")
    rfile.write("http://x", "r1", "1")
    assert (tmp_path / "state" / "tracking" / "trainer-0.json").exists()
    assert rfile.read("http://x") == "r1"


def test_a_down_server_never_blocks_and_drops_with_a_count(caplog):
    tr = tracking.Tracker("http://127.0.0.1:9", "down", queue_size=5)  # nothing listens on port 9
    t0 = time.monotonic()
    for i in range(20):
        tr.log_metrics({"a": i}, step=i)
    assert time.monotonic() - t0 < 0.1  # enqueue only
    t0 = time.monotonic()
    assert tr.close(timeout_s=3) >= 15  # 5 queued at most, the rest dropped at once
    assert time.monotonic() - t0 < 4
    assert "failed" in caplog.text and "dropped" in caplog.text


def test_a_server_that_never_answers_costs_the_caller_nothing_and_close_is_bounded(caplog):
    """A listener on loopback that accepts and never replies (a hung server): logging still
    only enqueues, and ``close`` returns after its timeout with the events counted as dropped."""
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    try:
        tr = tracking.Tracker(f"http://127.0.0.1:{lsock.getsockname()[1]}", "hung")
        t0 = time.monotonic()
        for i in range(50):
            tr.log_metrics({"a": i}, step=i)
        assert time.monotonic() - t0 < 0.1
        time.sleep(1.0)  # the thread is now waiting on the first request
        t0 = time.monotonic()
        dropped = tr.close(timeout_s=2)
        assert time.monotonic() - t0 < 3
        assert dropped >= 49 and tr.sent == 0
        assert "dropped" in caplog.text
    finally:
        lsock.close()


@pytest.fixture(scope="module")
def hours4(tmp_path_factory):
    root = tmp_path_factory.mktemp("hours")
    generator.generate_hours(root, 4, START, 3000, seed=5)
    return root


def _online(root, tmp, out, state, end, uri=None, extra=()):
    args = ["--single", "--mode", "continuous", "--data-root", str(root), "--start-hour", START,
            "--end-hour", end, "--state-dir", str(state), "--output", str(out), "--base-every-minutes", "180",
            "--poll-seconds", "0.2", "--threads", "1", *extra]
    if uri:
        args += ["--tracking-uri", uri]
    return _run(args, tmp)


def test_continuous_job_metrics_equal_its_summary_and_resume_continues_the_runs(mlflow_server, hours4, tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    r = _online(hours4, tmp_path, out, state, "20261120/02", mlflow_server.url)
    s = _summary(r)
    rid = tracking.RunIdFile(str(state), "job").read(mlflow_server.url)
    tid = tracking.RunIdFile(str(state), "trainer-0").read(mlflow_server.url)
    assert rid and tid and rid != tid, r.stderr[-2000:]
    c = _client(mlflow_server)
    run, child = c.get_run(rid), c.get_run(tid)
    # one parent run per job, a child run per trainer; the code's version on the job's run
    assert run.info.status == "FINISHED" and run.data.tags["elastic_ctr.role"] == "job"
    assert run.data.tags["elastic_ctr.job"] == run.info.run_name == "online-20261120-00"
    assert run.data.tags["mlflow.source.git.commit"] == tracking.code_version() and len(tracking.code_version()) == 40
    assert child.data.tags["mlflow.parentRunId"] == rid and child.data.tags["elastic_ctr.role"] == "trainer"
    assert child.data.tags["elastic_ctr.trainer_id"] == "0" and child.info.run_name == "online-20261120-00-trainer0"
    assert run.data.params["mode"] == "continuous" and run.data.params["trainers"] == "1"
    # the partitions trained are the job's datasets
    inputs = [(d.dataset.name, json.loads(d.dataset.source)["uri"]) for d in run.inputs.dataset_inputs]
    assert inputs == [(p["hour"], str(hours4 / p["hour"])) for p in s["partitions"]]
    step = {tracking.partition_step(START, p["hour"]): p for p in s["partitions"]}
    # one name per figure: the job's partition_rows (every trainer; one here) and the trainer's own share
    for run_id, key, field in ((rid, "auc_before", "auc_before"), (rid, "partition_rows", "rows"),
                               (tid, "train_auc", "train_auc"), (tid, "trainer_rows", "rows"),
                               (tid, "seconds", "seconds")):
        want = {k: p[field] for k, p in step.items() if p.get(field) is not None}
        assert _history(c, run_id, key) == pytest.approx(want), key
    assert not _history(c, rid, "train_auc") and not _history(c, tid, "auc_before") and not _history(c, rid, "rows")
    assert sorted(_history(c, rid, "auc_before")) == [1, 2]  # none before the first partition
    exports = s["exports"]
    assert _history(c, rid, "version_id") == {tracking.partition_step(START, e["hour"]): e["id"] for e in exports}
    assert _history(c, rid, "export_rows") == {tracking.partition_step(START, e["hour"]): e["rows"]
                                               for e in exports}
    for e in exports:
        assert run.data.tags[f"version.{e['id']}.kind"] == e["kind"]
        art = c.download_artifacts(rid, f"versions/{e['id']}.json", str(tmp_path / "dl"))
        doc = json.loads(open(art).read())
        assert doc["id"] == e["id"] and doc["kind"] == e["kind"] and doc["model_meta"]["sparse"]["kind"] == e["kind"]
    # resumed: the same runs go on with the next partition
    r2 = _online(hours4, tmp_path, out, state, "20261120/03", mlflow_server.url)
    s2 = _summary(r2)
    assert [p["hour"] for p in s2["partitions"]] == ["20261120/03"]
    assert tracking.RunIdFile(str(state), "job").read(mlflow_server.url) == rid
    assert tracking.RunIdFile(str(state), "trainer-0").read(mlflow_server.url) == tid
    assert _history(c, rid, "auc_before")[3] == pytest.approx(s2["partitions"][0]["auc_before"])


def test_a_child_run_waits_for_its_parent_and_the_transfer_names_versions_as_the_donefile(mlflow_server, tmp_path,
                                                                                         monkeypatch):
    """A trainer's run made before its job's run is nested under it once that exists; the
    transfer's run is the job's child, its versions base or patch (never delta)."""
    job = f"unit-job-{time.time_ns()}"
    child = tracking.Tracker(mlflow_server.url, f"{job}-trainer1", tags={tracking.ROLE_TAG: "trainer"},
                             parent_job=job)
    child.log_metrics({"train_auc": 0.6}, step=0)
    time.sleep(1.0)  # the child's thread is waiting for the parent
    parent = tracking.Tracker(mlflow_server.url, job, tags={tracking.ROLE_TAG: "job", tracking.JOB_TAG: job})
    parent.log_params({"x": 1})
    monkeypatch.setenv(tracking.JOB_ENV, job)
    transfer = tracking.start_transfer(str(tmp_path), "d", mlflow_server.url)
    tracking.log_rollout(transfer, 7, "delta", 1.5, {"Building": 0.5}, landed_to_served_s=30.0)
    for t in (child, parent, transfer):
        assert t.wait_idle(60) and t.close() == 0
    c = _client(mlflow_server)
    assert c.get_run(child.run_id).data.tags["mlflow.parentRunId"] == parent.run_id
    tr = c.get_run(transfer.run_id)
    assert tr.data.tags["mlflow.parentRunId"] == parent.run_id and tr.data.tags["version.7.kind"] == "patch"
    assert _history(c, transfer.run_id, "landed_to_served_seconds") == {7: 30.0}
    assert _history(c, transfer.run_id, "building_seconds") == {7: 0.5}


@pytest.mark.slow
def test_server_stopped_mid_job_same_model_and_a_warning(hours4, tmp_path):
    """Two identical single-process jobs (one thread: deterministic): one without tracking,
    one whose tracking server is killed after its first partition is logged."""
    from runtime import proc
    from runtime.local.mlflow_server import MlflowServer

    ref_out = tmp_path / "ref"
    _summary(_online(hours4, tmp_path, ref_out, tmp_path / "ref-state", "20261120/02"))
    with proc.ProcessGroup(tmp_path / "logs") as group:
        server = MlflowServer(tmp_path / "store", group).start()
        out, state = tmp_path / "out", tmp_path / "state"
        # the partitions land one by one: the server goes away once the first one is logged
        import shutil

        late = tmp_path / "late"
        shutil.copytree(hours4, late)
        for h in ("01", "02"):
            (late / "20261120" / h / partitions.DONE_MARKER).unlink()
        from tests.helpers import CliProcess

        p = CliProcess(["train", "--single", "--mode", "continuous", "--data-root", str(late), "--start-hour",
                        START, "--end-hour", "20261120/02", "--state-dir", str(state), "--output", str(out),
                        "--base-every-minutes", "180", "--poll-seconds", "0.2", "--threads", "1", "--tracking-uri", server.url],
                       tmp_path)
        try:
            p.wait_for("waiting for partition 20261120/01")
            c = _client(server)
            rid = None
            deadline = time.monotonic() + 120  # the job's run, then the trainer's: slow on a loaded machine
            while rid is None and time.monotonic() < deadline:
                rid = tracking.RunIdFile(str(state), "trainer-0").read(server.url)
                time.sleep(0.2)
            assert rid, "the trainer's run was not made:\n" + p.text()[-3000:]
            while not _history(c, rid, "train_auc") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert 0 in _history(c, rid, "train_auc"), p.text()[-3000:]
            server.stop()
            t0 = time.monotonic()
            for h in ("01", "02"):
                partitions.mark_complete(late / "20261120" / h)
            assert p.wait() == 0
            wall = time.monotonic() - t0
        finally:
            p.stop()
    text = p.text()
    assert "tracking" in text and "failed" in text and "dropped" in text
    assert wall < 120
    ref, got = _chain(ref_out), _chain(out)
    assert [c[0] for c in got] == [c[0] for c in ref] == ["base", "patch", "patch"]
    for (_, _, rk, rv), (_, _, gk, gv) in zip(ref, got):
        assert np.array_equal(rk, gk) and np.array_equal(rv.view(np.uint32), gv.view(np.uint32))


def test_a_child_whose_parent_never_comes_is_made_alone_at_close(mlflow_server):
    """Closing stops the wait for a parent: the run is made without one, its events sent,
    within the close's timeout (no busy loop meanwhile)."""
    child = tracking.Tracker(mlflow_server.url, "orphan", tags={tracking.ROLE_TAG: "trainer"},
                             parent_job=f"never-{time.time_ns()}")
    child.log_metrics({"train_auc": 0.7}, step=0)
    time.sleep(1.0)
    t0 = time.monotonic()
    assert child.close(timeout_s=10) == 0
    assert time.monotonic() - t0 < 10 and child.run_id
    run = _client(mlflow_server).get_run(child.run_id)
    assert "mlflow.parentRunId" not in run.data.tags and run.data.metrics["train_auc"] == pytest.approx(0.7)


def test_the_server_refuses_anonymous_and_wrong_logins(mlflow_server):
    """MLflow's basic auth: a write without a login or with a wrong password is 401 and
    creates nothing; the pipeline's login (the tracking credential) writes; /health is open."""
    import requests

    user, password = mlflow_server.login()
    api = mlflow_server.url + "/api/2.0/mlflow/experiments"
    name = "anonymous-write"
    assert requests.post(api + "/create", json={"name": name}, timeout=30).status_code == 401
    assert requests.post(api + "/create", json={"name": name}, auth=(user, password + "x"),
                         timeout=30).status_code == 401
    assert requests.get(api + "/get-by-name", params={"experiment_name": name}, auth=(user, password),
                        timeout=30).status_code == 404  # nothing was created
    assert requests.post(api + "/create", json={"name": name}, auth=(user, password), timeout=30).status_code == 200
    assert requests.get(mlflow_server.url + "/health", timeout=30).status_code == 200
