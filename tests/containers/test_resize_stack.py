"""Resizing the running dev stack the way ``pulumi config set`` + ``pulumi up`` would: renderings of the dev stack applied one after the other to the
stack running as containers (``Cluster.apply``, which plays ``pulumi up``: steps in
dependency order, each awaited as pulumi-kubernetes awaits it, deletions last):

    cubeShards 2 -> 3 -> 2, cubeReplicas 2 -> 1 -> 2, servingReplicas 2 -> 3 -> 2

with a client sending to the serving Service throughout (both serving pods answer before
the first change). Checked: no failed request, no answer that differs from the other
answers to the same request at the same version (an answer mixing two versions, or read
from an empty shard, scores differently), the served version at the end is the one served
before, every pod a step deleted exited 0 on SIGTERM within its grace period, and the
harness recorded no error. Each apply's duration is printed (``resize:`` lines) and written
to ``<tmp>/resize-results.json``.

The training job is left out of the renderings: the served version is published from the
host into the file server pod, as trainer 0 would publish it (``export_version``: a seeded
dense head and an embedding for every feasign of the test rows), which takes seconds
instead of a training run. Training resize is tested at process level.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime import role_specs
from tests.containers.kube import Cluster
from tests.containers.stack_steps import PROPAGATION_S, check_no_errors, dict_info, forbidden_log_lines, terminal_lines
from tests.containers.traffic import ServiceLoad

pytestmark = [pytest.mark.containers, pytest.mark.slow]

#: the pods' port (``runtime.role_specs.PORTS``)
FILES_PORT = role_specs.PORTS["fileserver"]["http"]

REPO = Path(__file__).resolve().parents[2]
BASE = {"pservers": "1", "trainers": "2", "cubeShards": "2", "cubeReplicas": "2", "servingReplicas": "2",
        "epochs": "1"}
#: the config changes, applied one after the other (each on top of the previous ones)
STEPS = [("cubeShards", "3"), ("cubeShards", "2"), ("cubeReplicas", "1"), ("cubeReplicas", "2"),
         ("servingReplicas", "3"), ("servingReplicas", "2")]
#: test rows the client sends (and whose feasigns the published version holds)
TEST_ROWS = 2000
RESULTS: dict = {"steps": []}

PUBLISH = r"""
import sys
import numpy as np
from runtime.trainer import set_paddle_flags
set_paddle_flags()
from runtime.formats import features
from runtime.serving.client import load_rows
from runtime.trainer.export import export_version
rows_file, root, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = load_rows([rows_file], "criteo")
keys = np.unique(rows.feasigns.ravel()).astype(np.uint64)
dim = 9
values = np.random.default_rng(seed).normal(0, 0.05, (len(keys), dim)).astype(np.float32)
rec = export_version(root, slots=features.DEFAULT_SLOTS, fmt="criteo", dim=dim, layers=[32, 16], keys=keys,
                     values=values, metrics={}, training={"note": "container resize test: published from the host"},
                     token=sys.stdin.read().strip(), seed=seed)
print("PUBLISHED", rec.id, len(keys))
"""


def rendering(cfg: dict[str, str], tag: str):
    """The dev stack rendered with ``cfg`` (the training job left out: see the module's docstring)."""
    from infra.render import render

    r = render("dev", [f"{k}={v}" for k, v in cfg.items()] + [f"imageTag={tag}"])
    return dataclasses.replace(r, manifests=[m for m in r.manifests if m.kind != "Job"])


@pytest.fixture(scope="module")
def say(request):
    return terminal_lines(request, "resize")


def publish(c: Cluster, rows: Path, seed: int) -> int:
    """Publishes a base version into the file server pod from the host; returns its id."""
    fs = c.live_pods("fileserver")[0]
    token = c.secrets["fileserver-upload-token"]["token"]
    pub = subprocess.run([sys.executable, "-c", PUBLISH, str(rows), f"http://{fs.ip}:{FILES_PORT}", str(seed)],
                         input=token, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert pub.returncode == 0, pub.stdout[-2000:] + pub.stderr[-3000:]
    return int(re.search(r"PUBLISHED (\d+) (\d+)", pub.stdout).group(1))


@pytest.mark.timeout(2400)
def test_resize_cube_shards_replicas_and_serving_with_zero_failed_requests(engine, images, tmp_path, say):
    from runtime.serving.client import encode_batches, load_rows
    from runtime.trainer.generator import generate

    cfg = dict(BASE)
    generate(tmp_path / "data", rows=10, test_rows=TEST_ROWS, seed=7)
    rows_file = tmp_path / "data" / "test.txt"
    # ELASTIC_CTR_LIVENESS_DELAY_S=180 delays every liveness probe (printed): on a machine
    # whose load makes a role take longer than its liveness window to start
    delay = float(os.environ.get("ELASTIC_CTR_LIVENESS_DELAY_S") or 0)
    if delay:
        say(f"WARNING: liveness probes start {delay:.0f} s late (ELASTIC_CTR_LIVENESS_DELAY_S; load {os.getloadavg()})")
    c = Cluster(rendering(cfg, images.tag), tmp_path / "stack", engine.env, liveness_delay_s=delay)
    load = None
    t_all = time.monotonic()
    try:
        c.start()
        c.wait_for("file server ready", lambda: all(p.ready for p in c.live_pods("fileserver")), timeout_s=180)
        v = publish(c, rows_file, seed=1)
        c.wait_for(f"/dict/info version {v}", lambda: dict_info(c).get("version") == v, timeout_s=300, every_s=1)
        c.wait_ready([p.name for p in c.live_pods("serving")], timeout_s=300)
        RESULTS["load_at_start"] = os.getloadavg()
        say(f"version {v} served by {len(c.live_pods('serving'))} serving pods, "
            f"{time.monotonic() - t_all:.0f} s after the start")
        bodies = [b for b, _, _ in encode_batches(load_rows([str(rows_file)], "criteo"), 16)]
        load = ServiceLoad(lambda: [(p.name, p.ip) for p in c.endpoints("serving", propagation_s=PROPAGATION_S)],
                           bodies, threads=2, rate=20.0, max_s=2100.0, check_answers=True).start()
        c.wait_for("both serving pods answered", lambda: len(load.stats.by_pod) >= 2, timeout_s=60)
        problems: list[str] = []
        failed_before = 0
        for key, value in STEPS:
            before = dict(cfg)
            cfg[key] = value
            new = rendering(cfg, images.tag)
            t0 = time.monotonic()
            rep = c.apply(new, timeout_s=600)
            secs = time.monotonic() - t0
            info = dict_info(c)
            unclean = [t.summary() for t in rep.terminations if not t.clean]
            RESULTS["steps"].append({"change": f"{key} {before[key]} -> {value}", "seconds": round(secs, 1),
                                     "steps": [str(s) for s in rep.steps], "dict_info_version": info.get("version"),
                                     "shard_num": info.get("shard_num"), "replica_num": info.get("replica_num"),
                                     "served_shard_num": info.get("served_shard_num"),
                                     "failed_so_far": load.stats.failed, "mismatched_so_far": load.stats.mismatched,
                                     "unclean_terminations": unclean})
            say(f"{key} {before[key]} -> {value}: applied in {secs:.1f} s ({rep.counts()}); /dict/info version "
                f"{info.get('version')} shards {info.get('shard_num')} replicas {info.get('replica_num')}; "
                f"client so far: {load.stats.requests} requests, {load.stats.failed} failed, "
                f"{load.stats.mismatched} mismatched")
            for s in rep.steps:
                say(f"    {s}")
            # every step runs (its time is a figure the README reports); what went wrong is asserted at the end
            if load.stats.failed > failed_before or load.stats.mismatched or unclean or c.errors:
                problems.append(f"{key}={value}: failed {load.stats.failed - failed_before} "
                                f"{load.stats.errors[-3:]}; mismatched {load.stats.mismatches}; unclean {unclean}; "
                                f"errors {c.errors[-3:]}")
                if c.errors:
                    break  # a failed pod: the stack is no longer what the next step expects
            failed_before = load.stats.failed
            wrong = info.get("version") != v or info.get("shard_num") != int(cfg["cubeShards"]) \
                or info.get("replica_num") != int(cfg["cubeReplicas"]) \
                or info.get("served_shard_num", info.get("shard_num")) != int(cfg["cubeShards"]) \
                or len(c.live_pods("serving")) != int(cfg["servingReplicas"])
            if wrong:
                problems.append(f"{key}={value}: /dict/info {info}; serving pods {len(c.live_pods('serving'))}")
        time.sleep(3)
        stats = load.stop()
        load = None
        RESULTS["load"] = stats.__dict__
        say(f"client: {stats.line()}")
        for e in stats.errors:
            say(f"client error: {e[:400]}")
        RESULTS["problems"] = problems
        assert not problems, "\n".join(problems)
        assert stats.failed == 0 and stats.ok > 0, stats.line()
        assert stats.mismatched == 0, stats.mismatches
        assert set(stats.by_version) == {str(v)}, stats.by_version  # no version was published meanwhile
        assert dict_info(c).get("version") == v
        bad = forbidden_log_lines(c)
        assert not bad, bad
        check_no_errors(c)
    finally:
        if load is not None:
            load.stop()
        try:
            c.teardown()
        finally:
            RESULTS["total_s"] = round(time.monotonic() - t_all, 1)
            (tmp_path / "resize-results.json").write_text(json.dumps(RESULTS, indent=1, default=str))
            say(f"results {tmp_path / 'resize-results.json'}; harness log {tmp_path / 'stack' / 'harness.log'}; "
                f"total {RESULTS['total_s']} s")
