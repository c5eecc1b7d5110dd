"""The rendered dev stack (1 pserver x 2 trainers, cube 2 shards x 2 replicas, 2 serving
pods) run as containers by ``tests/containers/kube/``, the way Kubernetes and Volcano
would run it, end to end and through its lifecycle:

1. the training job's pods finish and export a version to the file server pod;
2. the transfer pod rolls it out to every cube pod (its ``/dict/info``);
3. both serving pods become ready; ``elastic-ctr client`` (host, .venv) against each scores
   the test rows with zero failed requests, and the served AUC equals trainer 0's test AUC;
4. lifecycle, with a client sending through every case (``traffic.ServiceLoad``):
   (a) a serving pod deleted the Kubernetes way, (b) a cube pod killed and started empty,
   (c) the transfer pod restarted in the middle of a rollout of a second version,
   (e) docs/runbooks/rollback-on-a-cluster.md run as written (kubectl played on the harness),
   (d) every pod stopped with SIGTERM: every container exits 0, no traceback.

The tests run in file order on one module-scoped stack; each prints its figures
(``stack:`` lines) for the project's notes, and all of them are written to
``<tmp>/stack-results.json``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from runtime import role_specs
from tests.containers.kube import Cluster
from tests.containers.stack_steps import (MAX_ROLLOUT_ATTEMPTS, RESULTS, answers, check_no_errors, cube_versions, terminal_lines,
                                          dict_info, forbidden_log_lines, need, restart_transfer_mid_rollout,
                                          start_load, stop_load, transfer_url)

#: the pods' port (``runtime.role_specs.PORTS``)
FILES_PORT = role_specs.PORTS["fileserver"]["http"]
SERVING_PORT = role_specs.PORTS["serving"]["http"]
CONTROL_PORT = role_specs.PORTS["cube-server"]["http"]

pytestmark = [pytest.mark.containers, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
OVERRIDES = ["pservers=1", "trainers=2", "cubeShards=2", "cubeReplicas=2", "servingReplicas=2", "epochs=1"]
JOB = "ctr-train"


@pytest.fixture(scope="module")
def say(request):
    return terminal_lines(request, "stack")


@pytest.fixture(scope="module")
def stack(engine, images, tmp_path_factory, say):
    from infra.render import render

    work = tmp_path_factory.mktemp("stack")
    rendering = render("dev", [*OVERRIDES, f"imageTag={images.tag}"])
    rendered = {c["image"] for m in rendering.manifests if m.kind in ("Deployment", "StatefulSet")
                for c in m.body["spec"]["template"]["spec"]["containers"]}
    assert rendered <= set(images.refs.values()), (rendered, images.refs)
    # ELASTIC_CTR_STACK_IMAGE_MAP='{"elastic-ctr-cube:dev": "my-fix:1"}' runs other images in the
    # pods (to try a fix before it is in the tree); every substitution is printed: such a run
    # says nothing about the images the tree builds
    image_map = json.loads(os.environ.get("ELASTIC_CTR_STACK_IMAGE_MAP") or "{}")
    for a, b in image_map.items():
        say(f"WARNING: image {a} replaced by {b} in every pod (ELASTIC_CTR_STACK_IMAGE_MAP)")
    cluster = Cluster(rendering, work, engine.env, image_map=image_map)
    state = {"cluster": cluster, "work": work, "t0": time.monotonic()}
    try:
        cluster.start()
        say(f"run {cluster.run_id}: {len(cluster.live_pods())} pods, work dir {work}")
        yield state
    finally:
        load = state.get("load")
        if load is not None:
            load.stop()
        try:
            cluster.teardown()
        finally:
            (work / "stack-results.json").write_text(json.dumps(RESULTS, indent=1, default=str))
            say(f"results: {work / 'stack-results.json'}; harness log {work / 'harness.log'}; "
                f"rewrites {len(cluster.rewrites)}; total {time.monotonic() - state['t0']:.0f} s")


# ----------------------------------------------------------------------------- 1. training
@pytest.mark.timeout(900)
def test_training_job_completes_and_exports_a_version(stack, say):
    c: Cluster = stack["cluster"]
    t0 = time.monotonic()
    job = c.workloads[JOB]
    # Completing: every trainer exited 0 and the job controller is stopping the pservers
    # (CompleteJob); their termination is checked with every other role's in (d)
    c.wait_for(f"Job/{JOB} Completing", lambda: job.phase in ("Completing", "Completed", "Failed"), timeout_s=600,
               every_s=1, fail_on_errors=False)
    secs = time.monotonic() - t0
    exits = {f"{p.name}/{cr.name}": cr.exit_code for p in job.pods for cr in p.init_containers + p.containers}
    completion = [t.summary() for t in job.completion]
    RESULTS["training"] = {"phase": job.phase, "seconds": round(secs, 1), "exit_codes": exits,
                           "complete_job": completion}
    say(f"training: Job {job.phase} in {secs:.0f} s; exit codes {exits}")
    for t in job.completion:
        say(f"training: the job controller stopped {t.summary()}")
    assert job.phase in ("Completing", "Completed"), "\n".join(c.errors) + "\n" + c.status()
    log = c.logs(f"{JOB}-trainer-0")
    from runtime.formats.train_result import RESULT, TrainResult

    res = TrainResult.find(log, RESULT, source=f"{JOB}-trainer-0 log")
    assert res is not None, f"no result line in trainer 0's log:\n{log[-3000:]}"
    rec = res.to_dict()
    version, auc = int(rec["version"]), float(rec["test_auc"][-1])
    fs = c.live_pods("fileserver")[0]
    base = requests.get(f"http://{fs.ip}:{FILES_PORT}/donefile/base.txt", timeout=5)
    assert base.status_code == 200 and str(version) in base.text, base.text
    # the test rows trainer 0 evaluated on: its /data emptyDir (the pod is Completed, not deleted)
    test_rows = c.volume_dir(f"{JOB}-trainer-0", "data") / "test.txt"
    local = stack["work"] / "test.txt"
    local.write_bytes(test_rows.read_bytes())
    stack.update(version=version, trained_version=version, trainer_auc=auc, test_rows=local)
    RESULTS["training"].update(version=version, trainer_test_auc=auc, examples_per_s=rec.get("examples_per_s"))
    say(f"training: version {version} exported, trainer 0 test AUC {auc:.6f}, "
        f"{rec.get('examples_per_s')} examples/s; file server donefile: {base.text.strip()[-200:]}")


# ----------------------------------------------------------------------------- 2. rollout
@pytest.mark.timeout(300)
def test_transfer_rolls_the_version_out_to_every_cube_pod(stack, say):
    need(stack, "version")
    c: Cluster = stack["cluster"]
    v = stack["version"]
    t0 = time.monotonic()

    def served() -> dict | None:
        i = dict_info(c)
        if i.get("version") == v:
            return i
        last = i.get("last_rollout") or {}
        if last.get("version") == v and last.get("status") == "failed":
            try:
                hist = requests.get(transfer_url(c) + "/dict/deploy/history", timeout=3).json().get("history", [])
            except (requests.RequestException, ValueError):
                hist = []
            failed = [h for h in hist if h.get("version") == v and h.get("status") == "failed"]
            if len(failed) >= MAX_ROLLOUT_ATTEMPTS:  # the transfer gave the version up
                raise AssertionError(f"the transfer gave up version {v} after {len(failed)} failed rollouts; "
                                     f"last error: {last.get('error')}")
        return None

    info = c.wait_for(f"/dict/info version {v}", served, timeout_s=240, every_s=0.5)
    secs = time.monotonic() - t0
    versions = cube_versions(c)
    RESULTS["rollout"] = {"version": v, "seconds_after_export": round(secs, 1), "cube": versions,
                          "dict_info": {k: info.get(k) for k in ("version", "shard_num", "replica_num", "count", "status")}}
    say(f"rollout: version {v} served by the transfer (waited {secs:.1f} s after the job completed); "
        f"cube pods {versions}")
    assert set(versions.values()) == {v}, versions
    assert info["shard_num"] == 2 and info["replica_num"] == 2
    stack["rolled_out"] = True
    check_no_errors(c)


# ----------------------------------------------------------------------------- 2b. tracking
def _mlflow_login(c: Cluster) -> tuple[str, str]:
    """The stack's tracking login (MLflow's basic auth: the ``credentials-tracking`` Secret)."""
    login = c.secrets[f"credentials-{role_specs.TRACKING}"]
    return login[role_specs.TRACKING_USERNAME], login[role_specs.TRACKING_PASSWORD]


def _mlflow(c: Cluster, path: str, body: dict | None = None, **params) -> dict:
    """GET (POST with ``body``) ``/api/2.0/mlflow/<path>`` of the tracking pod, logged in
    (``_mlflow_login``), its Service's name as the Host header, as the trainers and the
    transfer reach it."""
    url = f"http://{c.live_pods('tracking')[0].ip}:5000/api/2.0/mlflow/{path}"
    kw = dict(timeout=10, headers={"Host": "tracking.elastic-ctr-dev.svc.cluster.local:5000"}, auth=_mlflow_login(c))
    r = requests.post(url, json=body, **kw) if body is not None else requests.get(url, params=params, **kw)
    assert r.status_code == 200, (path, r.status_code, r.text[:500])
    return r.json()


@pytest.mark.timeout(300)
def test_tracking_server_holds_the_jobs_run_and_the_rollout(stack, say):
    need(stack, "rolled_out")
    c: Cluster = stack["cluster"]
    exp = _mlflow(c, "experiments/get-by-name", experiment_name="elastic-ctr")["experiment"]
    runs = {}

    def both():
        found = _mlflow(c, "runs/search", {"experiment_ids": [exp["experiment_id"]]})
        for run in found.get("runs", []):
            tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
            runs[(tags.get("elastic_ctr.role"), tags.get("elastic_ctr.trainer_id"))] = run
        return (("job", None) in runs and ("trainer", "0") in runs and ("transfer", None) in runs
                and runs[("transfer", None)]["data"].get("metrics"))

    c.wait_for("the job's and the transfer's runs", both, timeout_s=120, every_s=2)
    job = runs[("job", None)]
    rid = job["info"]["run_id"]

    def hist(run_id, key):
        return {int(m.get("step", 0)): m["value"] for m in
                _mlflow(c, "metrics/get-history", run_id=run_id, metric_key=key).get("metrics", [])}

    v, auc = stack["version"], stack["trainer_auc"]
    assert job["info"]["status"] == "FINISHED"
    assert hist(rid, "test_auc") == {0: pytest.approx(auc, abs=1e-9)}  # one pass: the trainer's own result
    assert hist(rid, "version_id") == {0: v}
    params = {p["key"]: p["value"] for p in job["data"]["params"]}
    assert params["trainers"] == "2" and params["pservers"] == "1"
    for tid in ("0", "1"):  # each trainer's own figures: a child run of the job's, tagged with its id
        tags = {t["key"]: t["value"] for t in runs[("trainer", tid)]["data"]["tags"]}
        assert tags["mlflow.parentRunId"] == rid
    transfer = runs[("transfer", None)]["info"]["run_id"]
    assert {t["key"]: t["value"] for t in runs[("transfer", None)]["data"]["tags"]}["mlflow.parentRunId"] == rid
    rollout = hist(transfer, "rollout_seconds")
    assert v in rollout
    RESULTS["tracking"] = {"job_run": rid, "test_auc": hist(rid, "test_auc"), "rollout_seconds": rollout}
    say(f"tracking: run {rid} of the job: test_auc {hist(rid, 'test_auc')}, version {v}; transfer's run: "
        f"rollout seconds {rollout}")


# ----------------------------------------------------------------------------- 3. serving
@pytest.mark.timeout(420)
def test_both_serving_pods_score_the_test_rows_with_the_trainers_auc(stack, say):
    need(stack, "rolled_out", "test_rows")
    c: Cluster = stack["cluster"]
    t0 = time.monotonic()
    pods = c.live_pods("serving")
    c.wait_ready([p.name for p in pods], timeout_s=240)
    say(f"serving: both pods ready {time.monotonic() - t0:.1f} s after the rollout")
    procs = []
    for i, p in enumerate(pods):
        out = stack["work"] / f"client-{i}.json"
        cmd = [str(VENV_BIN / "elastic-ctr"), "client", "--url", f"http://{p.ip}:{SERVING_PORT}", "--data",
               str(stack["test_rows"]), "--format", "criteo", "--batch-size", "256", "--concurrency", "2",
               "--json-out", str(out)]
        procs.append((p, out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    reports = {}
    for p, out, proc in procs:
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"client against {p.name} exited {proc.returncode}:\n{text[-3000:]}"
        reports[p.name] = json.loads(out.read_text())
    auc = stack["trainer_auc"]
    RESULTS["serving"] = {}
    for name, rep in reports.items():
        RESULTS["serving"][name] = {k: rep[k] for k in ("requests", "failed_requests", "rows_scored", "qps", "p50_ms",
                                                         "p99_ms", "auc", "versions")}
        say(f"serving: client -> {name}: requests {rep['requests']}, failed {rep['failed_requests']}, "
            f"rows {rep['rows_scored']}, served AUC {rep['auc']:.6f} vs trainer AUC {auc:.6f} "
            f"(diff {abs(rep['auc'] - auc):.2e}), versions {rep['versions']}, p50 {rep['p50_ms']} ms")
        assert rep["failed_requests"] == 0 and rep["requests"] > 0, rep
        assert rep["versions"] == {str(stack["version"]): rep["requests"]}, rep["versions"]
        assert abs(rep["auc"] - auc) <= 1e-4, (rep["auc"], auc)
    stack["serving_ok"] = True
    check_no_errors(c)


# ----------------------------------------------------------------------------- 4a. serving pod deleted
@pytest.mark.timeout(420)
def test_a_serving_pod_deleted_the_kubernetes_way(stack, say):
    need(stack, "serving_ok")
    c: Cluster = stack["cluster"]
    load = start_load(stack, say)
    time.sleep(4)
    victim = c.live_pods("serving")[0]
    load.mark(victim.ip)
    t0 = time.monotonic()
    term = c.delete_pod(victim.name, watch_readiness_s=0.05)
    ended = time.monotonic() - t0
    rep = c.pods[term.replacement]
    c.wait_ready([rep.name], timeout_s=240)
    replaced = time.monotonic() - t0
    time.sleep(2)
    stats = stop_load(stack)
    ce = term.containers[0]
    RESULTS["a_serving_delete"] = {
        "pod": victim.name, "grace_s": term.grace_s, "exit_code": ce.exit_code, "exit_s": ce.seconds,
        "sigkilled": ce.sigkilled, "readiness_false_s": ce.first_not_ready_s, "kubelet_not_ready_s": ce.kubelet_not_ready_s,
        "replacement": rep.name, "replacement_ready_s": round(replaced, 1), "load": stats.__dict__}
    say(f"(a) {term.summary()}; kubelet-view readiness false at {ce.kubelet_not_ready_s:.2f} s (probe period 5 s); "
        f"deletion took {ended:.2f} s; replacement {rep.name} ready after {replaced:.1f} s")
    say(f"(a) client: {stats.line()}")
    for e in stats.errors:
        say(f"(a) client error: {e}")
    assert ce.exit_code == 0 and not ce.sigkilled, term.summary() + "\n" + c.logs(victim.name)[-3000:]
    assert ce.seconds is not None and ce.seconds <= term.grace_s
    assert ce.first_not_ready_s is not None and ce.first_not_ready_s <= ce.seconds, \
        f"readiness did not turn false before the exit: {term.summary()}"
    assert stats.inflight_completed == stats.inflight_at_mark, stats.line()
    assert stats.failed == 0 and stats.ok > 0, stats.line()
    check_no_errors(c)


# ----------------------------------------------------------------------------- 4b. cube pod killed
@pytest.mark.timeout(420)
def test_b_a_cube_pod_killed_comes_back_empty_and_is_reloaded(stack, say):
    need(stack, "serving_ok")
    c: Cluster = stack["cluster"]
    v = dict_info(c).get("version") or stack["version"]
    start_load(stack, say)
    time.sleep(3)
    t0 = time.monotonic()
    term = c.kill_pod("cube-2s-shard-0-0")
    new = c.pods[term.replacement]
    c.wait_for("cube-2s-shard-0-0 running", lambda: new.phase == "Running", timeout_s=120)
    c.wait_for("cube-2s-shard-0-0 answering", lambda: answers(new.ip), timeout_s=60)
    empty = requests.get(f"http://{new.ip}:{CONTROL_PORT}/status", timeout=5).json()
    c.wait_for(f"cube-2s-shard-0-0 back on version {v}",
                      lambda: cube_versions(c).get("cube-2s-shard-0-0") == v, timeout_s=150, every_s=0.5)
    reloaded = time.monotonic() - t0
    c.wait_ready([new.name], timeout_s=60)
    time.sleep(2)
    stats = stop_load(stack)
    RESULTS["b_cube_kill"] = {"pod": "cube-2s-shard-0-0", "exit_codes": {x.container: x.exit_code for x in term.containers},
                              "version_after_restart": empty.get("version"), "back_on_version_s": round(reloaded, 1),
                              "version": v, "load": stats.__dict__}
    say(f"(b) killed cube-2s-shard-0-0 ({term.summary()}); new pod started empty (version {empty.get('version')}), "
        f"back on version {v} {reloaded:.1f} s after the kill (transfer reconcile)")
    say(f"(b) client: {stats.line()}")
    for e in stats.errors:
        say(f"(b) client error: {e}")
    assert empty.get("version") != v, f"the new pod was not empty: {empty}"
    assert stats.failed == 0 and stats.ok > 0, stats.line()
    check_no_errors(c)


@pytest.mark.timeout(480)
def test_c_transfer_restarted_in_the_middle_of_a_rollout(stack, say):
    need(stack, "serving_ok")
    restart_transfer_mid_rollout(stack, say, "c_transfer_restart", "delete", seed=1)


@pytest.mark.timeout(480)
def test_c2_transfer_crashing_in_the_middle_of_a_rollout(stack, say):
    """A restart the Kubernetes way lets the transfer finish the step in progress
    (``--grace-period-seconds``); a crash (SIGKILL, e.g. an OOM kill or a node loss) leaves the
    rollout half done for the new pod to take over from its persisted state."""
    need(stack, "serving_ok")
    restart_transfer_mid_rollout(stack, say, "c2_transfer_crash", "kill", seed=2)


# ----------------------------------------------------------------------------- 4e. rollback, as its runbook says
@pytest.mark.timeout(600)
def test_c3_rollback_on_a_cluster_as_its_runbook_says(stack, say, engine):
    """docs/runbooks/rollback-on-a-cluster.md run as written (its bash blocks in order, kubectl
    played on the harness: tests/containers/runbook.py): through a port-forward with the
    credential copied from its Secret, the trained version is served again; from inside the
    transfer's pod, training is followed again and the newest version comes back; the client
    sends through both switches without a failed request."""
    need(stack, "serving_ok", "trained_version")
    from tests.containers import kubectl_shim, runbook

    c: Cluster = stack["cluster"]
    newest, target = dict_info(c).get("version"), stack["trained_version"]
    assert newest is not None and newest != target, (newest, target)
    work = stack["work"] / "runbook"
    work.mkdir(exist_ok=True)
    transfer = c.live_pods("cube-transfer")[0]
    kubectl_shim.write_state(work / "state.json", c.namespace, {"cube-transfer": transfer.ip},
                             {"cube-transfer": (transfer.containers[0].id, transfer.ip)}, c.secrets,
                             {k: v for k, v in engine.env.items() if k.startswith("DOCKER_")})
    page = REPO / "docs" / "runbooks" / "rollback-on-a-cluster.md"
    load = start_load(stack, say)
    t0 = time.monotonic()
    from runtime.proc import free_port

    r = runbook.run(page, {"NS": c.namespace, "PORT": str(free_port()), "VERSION": str(target)},
                    work / "state.json", work, timeout_s=540)
    secs = time.monotonic() - t0
    out = r.stdout + r.stderr
    RESULTS["c3_rollback_runbook"] = {"from": newest, "to": target, "seconds": round(secs, 1), "exit_code": r.returncode,
                                      "output": out.splitlines()[-20:]}
    say(f"(c3) the rollback runbook: exit {r.returncode} in {secs:.1f} s, {newest} -> {target} -> following again")
    assert r.returncode == 0, out[-4000:]
    assert f"version {target} is served (pinned" in out and "pin lifted: the transfer follows the donefiles" in out
    assert f'"pinned":{target}' in out.replace(" ", ""), out[-3000:]  # step 6's /dict/info
    c.wait_for(f"version {newest} served again, following training",
               lambda: (lambda i: i if i.get("version") == newest and i.get("pinned") is None
                        and i.get("status") == "serving" else None)(dict_info(c)), timeout_s=240, every_s=0.5)
    c.wait_for(f"serving answers {newest} again", lambda: str(newest) in load.stats.by_version, timeout_s=120)
    time.sleep(2)
    stats = stop_load(stack)
    RESULTS["c3_rollback_runbook"]["load"] = stats.__dict__
    say(f"(c3) client: {stats.line()}")
    assert str(target) in stats.by_version, stats.by_version  # the rolled-back version answered
    assert stats.failed == 0 and stats.ok > 0, stats.line()
    assert not (work / ".elastic-ctr").exists()  # step 8 removed the copied credential
    check_no_errors(c)


# ----------------------------------------------------------------------------- 4d. everything stops
@pytest.mark.timeout(300)
def test_d_every_container_stops_on_sigterm_with_exit_0(stack, say):
    need(stack, "version")
    c: Cluster = stack["cluster"]
    if "load" in stack:
        stop_load(stack)
    t0 = time.monotonic()
    terms = c.shutdown(watch_readiness_s=0.05)
    secs = time.monotonic() - t0
    rows = {}
    for t in terms:
        for x in t.containers:
            rows[f"{t.pod}/{x.container}"] = {"exit_code": x.exit_code, "seconds": x.seconds, "sigkilled": x.sigkilled,
                                              "readiness_false_s": x.first_not_ready_s}
    # the pserver was stopped with SIGTERM by CompleteJob (part 1): it is a role too
    for t in c.workloads[JOB].completion:
        for x in t.containers:
            rows[f"{t.pod}/{x.container} (CompleteJob)"] = {"exit_code": x.exit_code, "seconds": x.seconds,
                                                             "sigkilled": x.sigkilled}
    bad_logs = forbidden_log_lines(c)
    RESULTS["d_shutdown"] = {"seconds": round(secs, 1), "containers": rows, "forbidden_log_lines": bad_logs,
                             "errors": list(c.errors), "rewrites": [str(r) for r in c.rewrites]}
    say(f"(d) SIGTERM to {len(terms)} pods, all gone in {secs:.1f} s:")
    for t in terms:
        say(f"(d)   {t.summary()}")
    for t in c.workloads[JOB].completion:
        say(f"(d)   (CompleteJob) {t.summary()}")
    for k, v in bad_logs.items():
        say(f"(d)   forbidden lines in {k}: {v}")
    not_clean = {k: v for k, v in rows.items() if v["exit_code"] != 0 or v["sigkilled"]}
    assert not not_clean, f"containers that did not exit 0 on SIGTERM: {not_clean}"
    assert not bad_logs, bad_logs
    check_no_errors(c)


