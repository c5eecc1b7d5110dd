"""The shard change of tests/cube/test_resize_layouts.py through serving's own data
plane (``runtime.serving.launcher.build_dataplane``: the watcher with its topology's shard
count, the every-shard probe, the CTR model pinning each request's lookups to its dense
model's version): a plane on the 2-shard layout answers throughout, one on the
3-shard layout is not ready until the served chain is laid out there, requests move
to it, the old layout is stopped last; no request fails and every prediction equals
the offline prediction of the version it names (embeddings of that version's table).

Slow (a dense model exported by the trainer's export, Paddle in the test process).
"""
from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest

from runtime.formats import features
from tests.helpers import SERVING_DIM, export_version, make_table, offline_predict, write_version

pytestmark = pytest.mark.slow

BASE, PATCH, HELD = 1_790_000_001, 1_790_000_002, 1_790_000_003


def _rows(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["\t".join(["0"] + [str(int(rng.integers(0, 50))) for _ in range(13)]
                      + [format(int(rng.integers(0, 40)), "x") for _ in range(26)]) for _ in range(n)]


def _patch(root, vid: int, table: dict, seed: int) -> dict:
    """A patch changing a third of ``table``'s keys: its SequenceFile, and the base's dense
    model copied as its own (same weights, ``model_meta.json`` naming ``vid``)."""
    rng = np.random.default_rng(seed)
    keys = np.array(sorted(table), np.uint64)[::3]
    vals = rng.normal(0, 0.5, (len(keys), SERVING_DIM)).astype(np.float32)
    write_version(root, vid, keys, vals, parts=1)
    dense = root / "versions" / str(vid) / "dense"
    shutil.copytree(root / "versions" / str(BASE) / "dense", dense)
    meta = json.loads((dense / "model_meta.json").read_text())
    meta["version"] = vid
    (dense / "model_meta.json").write_text(json.dumps(meta))
    out = dict(table)
    out.update(zip(keys.tolist(), vals))
    return out


def _wait(cond, what, c, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        c.group.check()
        assert time.monotonic() < deadline, f"{what} not seen after {timeout_s:.0f} s; transfer says {c.info()}"
        time.sleep(0.05)


def test_serving_planes_across_a_shard_change(tmp_path):
    from runtime.local.cube import LocalCubeCluster
    from runtime.serving.launcher import build_dataplane

    root = tmp_path / "root"
    lines = _rows(48, 1)
    batch = features.parse_criteo_lines(lines)
    tables = {BASE: make_table(batch.feasigns, seed=3)}
    dense_dir = export_version(root, BASE, tables[BASE], seed=5)  # dense model, sparse files, base line
    tables[PATCH] = _patch(root, PATCH, tables[BASE], 11)
    tables[HELD] = _patch(root, HELD, tables[PATCH], 12)
    want = {v: offline_predict(dense_dir, t, batch.dense, batch.feasigns) for v, t in tables.items()}
    assert not np.allclose(want[BASE], want[PATCH]) and not np.allclose(want[PATCH], want[HELD])

    with LocalCubeCluster(tmp_path / "run", root, shards=2, replicas=1, poll_interval_s=0.1) as c:
        c.wait_version(BASE, timeout_s=120)
        c.publish_version(PATCH, BASE, patch=True, dim=SERVING_DIM)
        c.wait_version(PATCH, timeout_s=60)

        def plane(topology, name):
            return build_dataplane(str(topology), str(root), c.transfer_url, str(tmp_path / name), threads=2,
                                   poll_interval_s=0.1, wait_s=0.0)

        old = plane(c.topology_path, "sv-old")
        _wait(lambda: old.ready()[0], "the old plane ready", c)
        stop = threading.Event()
        active = [old]
        got = {"ok": 0, "by_version": {}, "errors": []}

        def send() -> None:
            i = 0
            while not stop.is_set():
                p = active[i % len(active)]
                i += 1
                try:
                    probs, v = p.default.predict_lines(lines)
                    np.testing.assert_allclose(np.asarray(probs).ravel(), want[v], rtol=1e-5, atol=1e-6)
                except Exception as exc:  # noqa: BLE001 - counted: the test's point
                    got["errors"].append(f"{type(exc).__name__}: {exc}"[:300])
                    continue
                got["ok"] += 1
                got["by_version"][v] = got["by_version"].get(v, 0) + 1

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            time.sleep(0.3)
            g3 = c.start_layout(3, 1)
            new = plane(g3.topology_path, "sv-new")
            c.restart_transfer(g3.topology_path)
            c.publish_version(HELD, BASE, patch=True, dim=SERVING_DIM)
            assert not new.ready()[0]
            _wait(lambda: new.ready()[0], "the new plane ready", c)
            active.append(new)
            time.sleep(0.3)
            active.remove(old)
            _wait(lambda: new.default.versions() == [str(HELD)], "the held patch served by the new plane", c)
            assert old.default.versions() == [str(PATCH)]
            assert set(c.stop_layout(c.layout).values()) == {0}
            time.sleep(0.3)
        finally:
            stop.set()
            sender.join(30)
            for p in (old, locals().get("new")):
                if p is not None:
                    p.default.watcher.stop()
        assert not got["errors"], got["errors"][:3]
        assert got["ok"] > 0 and set(got["by_version"]) <= {PATCH, HELD} and HELD in got["by_version"], got
