"""End to end on an S3-protocol server (moto on loopback, started by the test): the local
online demo with the hourly partitions (``--data-root s3://...``) and the version root
(``--model-root s3://...``) in a bucket, no file server. Every version is exported to the
bucket, rolled out from it and served with zero failed requests; the bucket holds each
partition's ``_SUCCESS``, the donefiles, the versions and the cube's shard tars."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime import storage
from runtime.formats import donefile
from tests.e2e.test_local_pipeline import REPO, _no_process_left

pytestmark = pytest.mark.slow


def test_local_online_demo_with_data_and_versions_in_a_bucket(s3_server, s3_bucket, tmp_path):
    run_dir = tmp_path / "run"
    data_root, model_root = f"{s3_bucket}/hours", f"{s3_bucket}/model"
    env = {**os.environ, **s3_server.env()}
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "local", "--run-dir", str(run_dir),
                        "--hours", "2", "--rows-per-hour", "8000", "--eval-rows", "1500",
                        "--latency-requests", "200", "--data-root", data_root, "--model-root", model_root],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    out = p.stdout[-4000:] + p.stderr[-4000:]
    assert p.returncode == 0, out
    assert "demo: versions=2 " in p.stdout and " failed_requests=0 " in p.stdout, out
    assert "version root (no file server) " + model_root in p.stdout, out
    _no_process_left(run_dir)
    assert not (run_dir / "logs" / "fileserver.log").exists()  # no file server was started
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_requests"] == 0 and summary["rollout"]["failed_requests"] == 0
    assert [v["kind"] for v in summary["versions"]] == ["base", "patch"]
    ids = [v["version"] for v in summary["versions"]]
    # the donefiles, the versions and the cube's published shard tars are in the bucket
    assert [r.id for r in donefile.read(model_root, "base")] == ids[:1]
    assert [r.id for r in donefile.read(model_root, "patch")] == ids[1:]
    for vid in ids:
        assert storage.exists(storage.join(model_root, donefile.dense_dir(vid), "model_meta.json"))
        assert storage.expand(storage.join(model_root, donefile.sparse_dir(vid)))
    tars = [t for vid in ids for t in storage.expand(storage.join(model_root, f"cube/ctr_embedding/{vid}/*.tar"))]
    assert len(tars) == 2 * len(ids), tars  # 2 shards per version
    # the hours trained landed in the bucket with their _SUCCESS (the last, scored only, never lands)
    assert [n for n, _ in storage.list_dir(data_root)] == ["20261120"]
    assert [n for n, _ in storage.list_dir(f"{data_root}/20261120")] == ["00", "01"]
    assert storage.exists(f"{data_root}/20261120/01/_SUCCESS")
