"""End to end: ``elastic-ctr local`` at a small size, every role a process on 127.0.0.1.

Checks: two versions trained, exported, rolled out and served; zero failed requests
(also while the second version rolls out, and the client saw both versions); the served
test AUC is close to what the generator's signal allows; the predictions served equal
the exported model's offline predictions (dense model loaded with Paddle directly,
embeddings read back from the exported SequenceFiles) for the same rows; no process is
left behind. Also: the pipeline runs on the real sample rows in ``../shared``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.formats import features

REPO = Path(__file__).resolve().parents[2]


def _run_local(run_dir: Path, *extra: str, timeout: float = 420) -> tuple[subprocess.CompletedProcess, dict]:
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "local", "--run-dir", str(run_dir), *extra],
                       cwd=REPO, capture_output=True, text=True, timeout=timeout)
    m = re.search(r"^demo: versions=(\d+) auc=([0-9.na]+) failed_requests=(\d+) qps=([0-9.]+) p99_ms=([0-9.]+) "
                  r"patches=(\d+)(?: quarantined=(\d+) held=(\d+))?$", p.stdout, re.M)
    assert m, f"no demo: line\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    demo = {"versions": int(m.group(1)), "auc": float(m.group(2)), "failed": int(m.group(3)),
            "qps": float(m.group(4)), "p99_ms": float(m.group(5)), "patches": int(m.group(6)),
            "quarantined": m.group(7) and int(m.group(7)), "held": m.group(8) and int(m.group(8))}
    return p, demo


def _no_process_left(run_dir: Path) -> None:
    """No process started by the run (its run directory on the command line) survives."""
    left = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmd and "pytest" not in cmd:
            left.append((d, cmd[:200]))
    assert not left, left


def _offline(dense_dir: Path, sparse_dir: Path, dense_raw: np.ndarray, fs: np.ndarray) -> np.ndarray:
    from runtime.formats.seqfile import read_sequence_file
    from tests.helpers import offline_predict

    table = {}
    for part in sorted(sparse_dir.glob("part-*")):
        keys, vals = read_sequence_file(str(part))
        table.update({int(k): np.asarray(v, np.float32) for k, v in zip(keys.tolist(), vals)})
    return offline_predict(dense_dir, table, dense_raw, fs)


@pytest.mark.slow
def test_local_pipeline_small(tmp_path):
    run_dir = tmp_path / "run"
    p, demo = _run_local(run_dir, "--mode", "rounds", "--rows", "40000", "--test-rows", "3000", "--epochs", "2",
                         "--latency-requests", "500")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    _no_process_left(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert demo["versions"] == 2 and demo["failed"] == 0
    assert summary["failed_requests"] == 0
    v1, v2 = (r["version"] for r in summary["rounds"])
    assert v2 > v1
    # the client kept sending through the rollout and saw both versions, none failed
    assert set(summary["rollout"]["versions"]) == {str(v1), str(v2)}
    assert summary["rollout"]["failed_requests"] == 0
    # AUC: well above chance, close to what the generator's signal allows
    sig = summary["signal_auc"]
    for r in summary["rounds"]:
        assert r["served_auc"] > 0.5 + 0.6 * (sig - 0.5), (r, sig)
        assert abs(r["served_auc"] - r["train_auc"][-1] if isinstance(r["train_auc"], list)
                   else r["served_auc"] - r["train_auc"]) < 0.01, r
    assert demo["auc"] == pytest.approx(summary["rounds"][-1]["served_auc"], abs=1e-4)
    # served predictions == the exported model's offline predictions, same rows
    lines = Path(summary["test_data"]).read_text().splitlines()
    b = features.parse_criteo_lines(lines)
    served = np.full(len(b), np.nan)
    for ln in (run_dir / "client-score-2.tsv").read_text().splitlines():
        row, _label, prob, ver = ln.split("\t")
        assert int(ver) == v2
        served[int(row)] = float(prob)
    assert not np.isnan(served).any()
    vdir = run_dir / "fileserver" / "versions" / str(v2)
    want = _offline(vdir / "dense", vdir / "sparse", b.dense, b.feasigns)
    diff = np.abs(served - want).max()
    assert diff < 1e-5, f"max abs diff served vs offline: {diff}"


@pytest.mark.slow
def test_local_pipeline_on_real_sample_rows(tmp_path, shared_dir):
    """The 200 real Criteo rows (CSV with a header): the pipeline completes and says the
    AUC means little."""
    run_dir = tmp_path / "run"
    p, demo = _run_local(run_dir, "--data", str(shared_dir / "data" / "samples" / "criteo_sample.csv"),
                         "--rounds", "1", "--epochs", "1", "--latency-requests", "100", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "means little" in p.stdout
    assert demo["versions"] == 1 and demo["failed"] == 0
    _no_process_left(run_dir)


def _table_upto(root: Path, version: int) -> dict:
    """The sparse table a cube serving ``version`` holds: its base, then every patch of that
    base up to ``version``, in id order (read from the exported SequenceFiles)."""
    from runtime.formats import donefile
    from runtime.formats.seqfile import read_sequence_file

    bases = donefile.read(str(root), "base")
    patches = donefile.read(str(root), "patch")
    own = [r for r in bases + patches if r.id == version][0]
    base_id = own.key
    chain = [r for r in bases if r.id == base_id] + sorted(
        (r for r in patches if r.key == base_id and r.id <= version), key=lambda r: r.id)
    table: dict = {}
    for r in chain:
        for part in sorted((root / r.input).glob("part-*")):
            keys, vals = read_sequence_file(str(part))
            table.update({int(k): np.asarray(v, np.float32) for k, v in zip(keys.tolist(), vals)})
    return table


@pytest.mark.slow
def test_local_online_loop_base_then_patches(tmp_path):
    """The online demo at a small size: a base and patches, each rolled out while the client
    keeps sending (no failed request); each version's served predictions equal the
    exported dense model of that version fed with base + patches up to it; the latest
    patch scores the next hour better than the base alone."""
    from tests.helpers import offline_predict

    run_dir = tmp_path / "run"
    p, demo = _run_local(run_dir, "--hours", "3", "--rows-per-hour", "12000", "--eval-rows", "2000",
                         "--latency-requests", "300", "--no-wait", timeout=480)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    _no_process_left(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    kinds = [v["kind"] for v in summary["versions"]]
    assert kinds == ["base", "patch", "patch"] and demo["patches"] == 2 and demo["versions"] == 3
    assert demo["quarantined"] == 0 and demo["held"] == 0  # the gates let a normal run through
    assert demo["failed"] == 0 and summary["rollout"]["failed_requests"] == 0
    ids = [v["version"] for v in summary["versions"]]
    assert ids == sorted(ids)
    assert set(summary["rollout"]["versions"]) == {str(i) for i in ids}  # the client saw every version
    root = run_dir / "fileserver"
    for t, v in enumerate(summary["versions"], start=1):
        assert v["scored_rows"] == 2000  # every row answered by that version
        b = features.parse_criteo_lines(Path(summary["eval_files"][t]).read_text().splitlines())
        served = np.full(len(b), np.nan)
        for ln in (run_dir / f"client-hour-{t}.tsv").read_text().splitlines():
            row, _label, prob, ver = ln.split("\t")
            assert int(ver) == v["version"]
            served[int(row)] = float(prob)
        want = offline_predict(root / "versions" / str(v["version"]) / "dense", _table_upto(root, v["version"]),
                               b.dense, b.feasigns)
        diff = float(np.abs(served - want).max())
        assert diff < 1e-5, (v, diff)
    assert summary["versions"][-1]["served_auc_next"] > summary["base_alone_auc_last"]
    _check_tracking(run_dir, summary, p.stdout)


def _check_tracking(run_dir: Path, summary: dict, stdout: str) -> None:
    """The demo's MLflow server (stopped at once: --no-wait) holds the job's run with the
    demo's figures and the transfer's run with each version's rollout; the chart is a PNG."""
    import mlflow

    from runtime import tracking

    chart = Path(summary["chart"])
    assert chart.parent == run_dir and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec = summary["tracking"]
    assert rec and f"MLflow run: {rec['uri']}/#/experiments/{rec['experiment_id']}/runs/{rec['run_id']}" in stdout
    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")  # the store, read directly

    def hist(run_id, key):
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    start = summary["versions"][0]["hour"]
    served = hist(rec["run_id"], "served_auc_next")
    assert served == pytest.approx({t: v["served_auc_next"] for t, v in enumerate(summary["versions"], start=1)})
    assert sorted(hist(rec["run_id"], "auc_before")) == [1, 2]  # the trainer's, beside the served AUC
    assert hist(rec["run_id"], "base_alone_auc")[3] == pytest.approx(summary["base_alone_auc_last"])
    assert hist(rec["run_id"], "version_id") == {tracking.partition_step(start, v["hour"]): v["version"]
                                                 for v in summary["versions"]}
    (transfer,) = client.search_runs([rec["experiment_id"]], "tags.`elastic_ctr.role` = 'transfer'")
    assert transfer.data.tags["mlflow.parentRunId"] == rec["run_id"]  # the job's child
    rollouts = hist(transfer.info.run_id, "rollout_seconds")
    assert sorted(rollouts) == [v["version"] for v in summary["versions"]]
    assert set(hist(transfer.info.run_id, "enabling_seconds")) == set(rollouts)
