"""Serving with Triton's own clients (tritonclient 2.73, http and grpc): health, metadata,
inference with binary and JSON tensors and over gRPC at n = 1 and n = 64, every answer equal
to ``/predict``'s for the same rows, and bad requests refused through both transports with
the status and the message naming what was wrong.

The clients need protobuf >= 6, which Paddle 3.0 does not accept, so they run in their own
venv (``.venv-tritonclient``, made by ``make install``): ``tritonclient_probe.py`` makes the
calls there and prints what came back; serving runs here (REST on uvicorn as serving's
workers serve it, gRPC on its gRPC server, both over one data plane).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from werkzeug.test import Client

from runtime.web.limits import ServerLimits
from runtime.serving.asgi import ServingApp
from runtime.serving.grpc_server import GrpcServer
from runtime.serving.rest import create_app
from tests.helpers import V1
from tests.serving.conftest import ctr_plane
from tests.serving.server import ServingThread

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("tritonclient_probe.py")
TRITON_PYTHON = Path(os.environ.get("ELASTIC_CTR_TRITONCLIENT_PYTHON", REPO / ".venv-tritonclient" / "bin" / "python"))


@pytest.fixture
def probe(served, env, tmp_path):
    if not TRITON_PYTHON.exists():
        reason = f"{TRITON_PYTHON} is absent: `make install` creates the tritonclient venv"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    b = env["batch"]
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"dense": [[None if np.isnan(x) else float(x) for x in r] for r in b.dense],
                                "feasigns": b.feasigns.tolist(), "lines": env["lines"]}))
    plane = ctr_plane(served["watcher"], served["cube"], max_batch=64)
    app = create_app(plane)
    with ServingThread(ServingApp(app, ServerLimits(), threads=4)) as http:
        grpc_server = GrpcServer(plane, "127.0.0.1", 0, threads=4).start()
        try:
            predict = Client(app).post("/predict", json={"lines": env["lines"]}).json
            r = subprocess.run([str(TRITON_PYTHON), str(PROBE), f"127.0.0.1:{http.port}", f"127.0.0.1:{grpc_server.port}",
                                str(rows)], capture_output=True, text=True, timeout=120)
        finally:
            grpc_server.stop(grace_s=1)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), np.array(predict["probabilities"])


def test_health_and_metadata(probe):
    out, _ = probe
    for transport in ("http", "grpc"):
        h = out[transport]["health"]
        assert h["live"] and h["ready"] and h["model_ready"], (transport, h)
        assert h["server"]["name"] == "elastic-ctr" and "binary_tensor_data" in h["server"]["extensions"]
        assert h["model"]["versions"] == [str(V1)]
        assert {t["name"]: (t["datatype"], list(t["shape"])) for t in h["model"]["inputs"]} == {
            "dense_features": ("FP32", [-1, 13]), "feasigns": ("UINT64", [-1, 26]), "lines": ("BYTES", [-1])}


@pytest.mark.parametrize("n", [1, 64])
def test_every_client_mode_answers_as_predict(probe, n):
    out, want = probe
    answers = {f"{t}:{k}": v for t in ("http", "grpc") for k, v in out[t].items()
               if k.endswith((f"-{n}-binary", f"-{n}-json", f"-{n}-defaults", f"-{n}-raw"))}
    assert len(answers) == 6, sorted(answers)  # http: binary, json, defaults, lines; grpc: features, lines
    for mode, a in answers.items():
        np.testing.assert_allclose(a["probability"], want[:n], rtol=1e-5, atol=1e-7, err_msg=mode)
        if "model_version" in a:
            assert a["model_version"] == str(V1), mode
    assert out["http"][f"features-{n}-binary"]["binary_output"] is True
    assert out["http"][f"features-{n}-json"]["binary_output"] is False
    assert out["http"][f"features-{n}-binary"]["id"] == f"h{n}True"
    g = out["grpc"][f"features-{n}-raw"]
    assert g["id"] == f"g{n}" and g["cube_version"] == V1


@pytest.mark.parametrize("case, http_status, grpc_status, needle", [
    ("nan", "400", "StatusCode.INVALID_ARGUMENT", "element 17 (index [1, 4])"),
    ("wrong-datatype", "400", "StatusCode.INVALID_ARGUMENT", "expected FP32 for 'dense_features'"),
    ("shape", "400", "StatusCode.INVALID_ARGUMENT", "expected [n,13]"),
    ("unknown-input", "400", "StatusCode.INVALID_ARGUMENT", "unknown input 'dense'"),
    ("unknown-model", "404", "StatusCode.NOT_FOUND", "model 'nope' not found"),
    ("unknown-version", "404", "StatusCode.NOT_FOUND", "version '42' is not being served"),
    ("oversized-batch", "400", "StatusCode.INVALID_ARGUMENT", "batch of 65 samples exceeds the limit of 64"),
])
def test_bad_requests_through_both_transports(probe, case, http_status, grpc_status, needle):
    out, _ = probe
    errors = {"http-json": out["http"][f"bad-{case}-json"], "http-binary": out["http"][f"bad-{case}-binary"],
              "grpc": out["grpc"][f"bad-{case}"]}
    for where, err in errors.items():
        want = grpc_status if where == "grpc" else http_status
        assert err["status"] == want, (where, err)
        if case == "nan":
            assert needle in err["message"] and "NaN" in err["message"] and "inputs[0]" in err["message"], (where, err)
        else:
            assert needle in err["message"], (where, err)
