"""Rollback and pinning at process level: the trainer's export
publishes a base and patches, a local cube (file server, transfer, 2 shards x 2
replicas) rolls them out, ``elastic-ctr serve`` answers a client load throughout. Then
``elastic-ctr rollback --to`` an older patch, a newer patch held back while pinned, a pin
by the transfer's ``--pin-version`` flag (the stack's ``servedVersion``) to the base,
and the flag lifted: every request answered (0 failed), every answer equal to the
offline answer of the version it names, each target served in turn."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from runtime.formats import features
from tests.helpers import PredictLoad, export_version, make_table, offline_predict, start_serving

pytestmark = pytest.mark.slow

V1, V2, V3, V4 = 1_800_000_100, 1_800_000_101, 1_800_000_102, 1_800_000_103


def _lines(n: int = 48) -> list[str]:
    rng = np.random.default_rng(1)
    return ["\t".join([str(i % 2)] + [str(int(rng.integers(0, 50))) for _ in range(13)]
                      + [format(int(rng.integers(0, 30)), "x") for _ in range(26)]) for i in range(n)]


def _patch(full: dict, seed: int, every: int) -> dict:
    """New embeddings for every ``every``-th key of ``full`` (a patch's rows)."""
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0, 0.5, len(v)).astype(np.float32) for i, (k, v) in enumerate(sorted(full.items()))
            if i % every == 0}


def _served(url: str, lines: list[str]) -> int:
    return requests.post(url + "/predict", json={"lines": lines}, timeout=10).json()["model_version"]


def _wait_served(url: str, lines: list[str], version: int, group, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        if _served(url, lines) == version:
            return
        time.sleep(0.1)
    raise TimeoutError(f"serving did not switch to {version}")


def test_rollback_and_pin_under_load(tmp_path):
    from runtime.local.cube import LocalCubeCluster

    lines = _lines()
    b = features.parse_criteo_lines(lines)
    root = tmp_path / "root"
    t1 = make_table(b.feasigns, 1)
    patches = {V2: _patch(t1, 2, 2), V3: _patch(t1, 3, 3), V4: _patch(t1, 4, 2)}
    dirs = {V1: export_version(root, V1, t1, seed=1)}
    for i, v in enumerate((V2, V3), 2):
        dirs[v] = export_version(root, v, patches[v], seed=i, base=V1)
    tables, acc = {V1: dict(t1)}, dict(t1)
    for v in (V2, V3, V4):
        acc = {**acc, **patches[v]}
        tables[v] = acc
    n = 16
    want = {v: None for v in (V1, V2, V3, V4)}

    def offline(v):
        if want[v] is None:
            want[v] = offline_predict(dirs[v], tables[v], b.dense[:n], b.feasigns[:n])
        return want[v]

    with LocalCubeCluster(tmp_path / "cube", root, shards=2, replicas=2, poll_interval_s=0.1) as cube:
        cube.wait_version(V3, timeout_s=180)
        url = start_serving(cube, tmp_path / "sv")
        _wait_served(url, lines[:n], V3, cube.group)

        answers: list[tuple[int, list[float]]] = []
        load = PredictLoad(url, lines[:n], lambda v, probs: answers.append((v, probs))).start()
        try:
            # 1. elastic-ctr rollback --to V2 (an older patch): its chain laid out, serving follows
            # the operator's shell holds the run's cube-control credential (the transfer asks for it)
            r = subprocess.run([sys.executable, "-m", "runtime.cli", "rollback", "--to", str(V2), "--transfer-url",
                                cube.transfer_url, "--wait", "120"], capture_output=True, text=True, timeout=180,
                               env={**os.environ, **cube.env})
            assert r.returncode == 0, r.stdout + r.stderr
            assert cube.info().pinned == V2
            _wait_served(url, lines[:n], V2, cube.group)
            # 2. a newer patch is held back while V2 is pinned
            dirs[V4] = export_version(root, V4, patches[V4], seed=4, base=V1)
            time.sleep(2.0)
            assert cube.info().version == V2 and _served(url, lines[:n]) == V2
            # 3. the flag pins the base (servedVersion); 4. the flag left out: follow training again
            spec = cube._transfer_spec
            cube._transfer_spec = dataclasses.replace(spec, args=tuple(spec.args) + ("--pin-version", str(V1)))
            cube.restart_transfer()
            cube.wait_version(V1, timeout_s=120)
            assert cube.info().pinned == V1
            _wait_served(url, lines[:n], V1, cube.group)
            cube._transfer_spec = spec
            cube.restart_transfer()
            cube.wait_version(V4, timeout_s=180)
            assert cube.info().pinned is None
            _wait_served(url, lines[:n], V4, cube.group)
            time.sleep(0.5)
        finally:
            load.stop()
        assert not load.errors, load.errors[:5]
        seen = {}
        for v, probs in answers:
            np.testing.assert_allclose(probs, offline(v), rtol=1e-5, atol=1e-6, err_msg=f"version {v}")
            seen[v] = seen.get(v, 0) + 1
        assert {V1, V2, V3, V4} <= set(seen), seen
        print(f"rollback and pins under load: {len(answers)} requests, 0 failed, answers per version {seen}")
