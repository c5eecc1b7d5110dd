"""Serving checks a version's dense model against its manifest before loading it: a
parameter file cut or altered, or the manifest missing, is refused with an error naming
the file and what differs; the previous version keeps answering every request."""
from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest
from werkzeug.test import Client

from runtime.formats import donefile, manifest
from runtime.serving.model import VersionWatcher
from runtime.serving.rest import create_app
from tests.helpers import SERVING_DIM, V1, V2, FakeCube, offline_predict
from tests.serving.conftest import ctr_plane
from tests.serving.test_server import v2_request


def _line(root, v):
    donefile.append(str(root), "base", donefile.base_record(v, dim=SERVING_DIM, count=1,
                                                            manifest=manifest.location(v)))


def _damage(vdir, kind):
    p = vdir / "dense" / "inference.pdiparams"
    if kind == "cut":
        p.write_bytes(p.read_bytes()[:-40])
        return "inference.pdiparams: size"
    if kind == "altered":
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x55
        p.write_bytes(bytes(b))
        return "inference.pdiparams: sha256"
    (vdir / manifest.FILE).unlink()
    return "manifest.json: manifest missing"


@pytest.mark.parametrize("kind", ["cut", "altered", "manifest_missing"])
def test_damaged_dense_model_is_refused_and_the_previous_version_keeps_serving(env, tmp_path, kind):
    root = tmp_path / "root"
    (root / "versions").mkdir(parents=True)
    (root / "versions" / str(V1)).symlink_to(env["root"] / "versions" / str(V1))
    shutil.copytree(env["root"] / "versions" / str(V2), root / "versions" / str(V2))
    _line(root, V1)
    cube = FakeCube(dict(env["tables"]))
    watcher = VersionWatcher(str(root), None, tmp_path / "work", pool_size=2,
                             probe=lambda v: cube.seek(np.zeros(1, np.uint64), version=v))
    plane = ctr_plane(watcher, cube, max_batch=32)
    assert watcher.poll_once() and watcher.current.version == V1
    b, n = env["batch"], 8
    want = offline_predict(env["dirs"][V1], env["tables"][V1], b.dense[:n], b.feasigns[:n])
    req = json.dumps(v2_request(b, slice(0, n)))
    errors, answered, stop = [], [0], threading.Event()

    def worker():
        cl = Client(create_app(plane))
        while not stop.is_set():
            r = cl.post("/v2/models/ctr/infer", data=req, content_type="application/json")
            if r.status_code != 200 or r.json["model_version"] != str(V1):
                errors.append(r.data[:200])
                continue
            np.testing.assert_allclose(r.json["outputs"][0]["data"], want, rtol=1e-5, atol=1e-6)
            answered[0] += 1

    def answered_more_than(n: int) -> None:  # the client is answered (a loaded machine may take a while)
        deadline = time.monotonic() + 30
        while answered[0] <= n and not errors and time.monotonic() < deadline:
            time.sleep(0.01)

    t = threading.Thread(target=worker)
    t.start()
    try:
        answered_more_than(0)
        why = _damage(root / "versions" / str(V2), kind)
        _line(root, V2)
        assert not watcher.poll_once()
        assert watcher.current.version == V1
        assert f"version {V2} refused" in watcher.last_error and why in watcher.last_error, watcher.last_error
        answered_more_than(answered[0])  # and still answered by V1 after the refusal
    finally:
        stop.set()
        t.join()
    assert not errors and answered[0] > 0, (errors[:3], answered)
