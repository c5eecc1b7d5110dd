"""Serving's dense backends (runtime/dense_backends.py): on ONNX Runtime and on Paddle
Inference, the answers over JSON, binary tensors and gRPC equal the trainer's offline
predictions (Paddle Inference on the exported program, embeddings read from the table)
within 1e-5; a version without model.onnx runs on Paddle Inference under the onnxruntime
backend, or is refused naming why where Paddle is not installed; a new version gets its
own session; metadata and metrics name the backend."""
from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
from werkzeug.test import Client

from runtime import dense_backends
from runtime.formats.model_meta import ModelMeta, OnnxExport
from runtime.serving.grpc_server import GrpcServer
from runtime.serving.model import DenseModel, ModelLoadError, VersionWatcher
from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc
from runtime.serving.rest import create_app
from tests.helpers import V1, V2, FakeCube, offline_predict, publish, wait_until
from tests.serving.conftest import ctr_plane

TOL = 1e-5
N = 20


@pytest.fixture(params=dense_backends.BACKENDS)
def on_backend(request, env, tmp_path):
    """A data plane at V1 on one dense backend, behind the REST app and a gRPC server."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "versions").symlink_to(env["root"] / "versions")
    publish(root, V1)
    cube = FakeCube(dict(env["tables"]))
    watcher = VersionWatcher(str(root), None, tmp_path / "work", pool_size=2, dense_backend=request.param)
    plane = ctr_plane(watcher, cube, max_batch=64)
    assert watcher.poll_once() and watcher.current.backend == request.param
    server = GrpcServer(plane, "127.0.0.1", 0, threads=2).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield {"backend": request.param, "root": root, "watcher": watcher, "plane": plane,
           "client": Client(create_app(plane)), "stub": pb_grpc.GRPCInferenceServiceStub(channel)}
    channel.close()
    server.stop(grace_s=1)


def _offline(env, version=V1, rows=slice(0, N)):
    b = env["batch"]
    return offline_predict(env["dirs"][version], env["tables"][version], b.dense[rows], b.feasigns[rows])


def test_dense_backend_json_answers_equal_the_offline_predictions(on_backend, env):
    b = env["batch"]
    dd = [None if np.isnan(x) else float(x) for x in b.dense[:N].ravel()]
    r = on_backend["client"].post("/v2/models/ctr/infer", json={"inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [N, 13], "data": dd},
        {"name": "feasigns", "datatype": "UINT64", "shape": [N, 26], "data": [int(x) for x in b.feasigns[:N].ravel()]}]})
    assert r.status_code == 200, r.json
    got = np.asarray(r.json["outputs"][0]["data"], np.float32)
    assert np.abs(got - _offline(env)).max() <= TOL
    # a batch of 1 and the raw lines of the rows too
    one = on_backend["client"].post("/predict", json={"lines": env["lines"][:1]}).json["probabilities"]
    assert abs(one[0] - _offline(env)[0]) <= TOL


def test_dense_backend_binary_answers_equal_the_offline_predictions(on_backend, env):
    b = env["batch"]
    dense = np.nan_to_num(b.dense[:N]).astype("<f4")  # binary data has no null: 0 = missing, as normalized
    fs = b.feasigns[:N].astype("<u8")
    head = json.dumps({"inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [N, 13], "parameters": {"binary_data_size": dense.nbytes}},
        {"name": "feasigns", "datatype": "UINT64", "shape": [N, 26], "parameters": {"binary_data_size": fs.nbytes}}],
        "parameters": {"binary_data_output": True}}).encode()
    r = on_backend["client"].post("/v2/models/ctr/infer", data=head + dense.tobytes() + fs.tobytes(),
                                  headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.data[:300]
    hl = int(r.headers["Inference-Header-Content-Length"])
    got = np.frombuffer(r.data[hl:], "<f4")
    want = offline_predict(env["dirs"][V1], env["tables"][V1], dense, fs)
    assert np.abs(got - want).max() <= TOL


def test_dense_backend_grpc_answers_equal_the_offline_predictions(on_backend, env):
    b = env["batch"]
    dense = np.nan_to_num(b.dense[:N]).astype("<f4")
    fs = b.feasigns[:N].astype("<u8")
    req = pb.ModelInferRequest(model_name="ctr")
    req.inputs.add(name="dense_features", datatype="FP32", shape=[N, 13])
    req.inputs.add(name="feasigns", datatype="UINT64", shape=[N, 26])
    req.raw_input_contents.extend([dense.tobytes(), fs.tobytes()])
    r = on_backend["stub"].ModelInfer(req)
    got = np.frombuffer(r.raw_output_contents[0], "<f4")
    want = offline_predict(env["dirs"][V1], env["tables"][V1], dense, fs)
    assert r.model_version == str(V1) and np.abs(got - want).max() <= TOL


def test_dense_backend_named_in_metadata_and_metrics(on_backend):
    c, backend = on_backend["client"], on_backend["backend"]
    assert c.get("/v2/models/ctr").json["platform"] == dense_backends.PLATFORMS[backend]
    text = c.get("/metrics").data.decode()
    for b in dense_backends.BACKENDS:
        assert f'elastic_ctr_serving_dense_backend{{backend="{b}"}} {1.0 if b == backend else 0.0}' in text


def test_dense_backend_new_version_gets_its_own_session_and_answers_as_offline(on_backend, env):
    watcher, c = on_backend["watcher"], on_backend["client"]
    old = watcher.current
    publish(on_backend["root"], V2)
    assert wait_until(watcher.poll_once, 30) and watcher.current.version == V2
    assert watcher.current.predictor is not old.predictor and watcher.current.backend == on_backend["backend"]
    p = c.post("/predict", json={"lines": env["lines"][:N]}).json
    assert p["model_version"] == V2
    assert np.abs(np.asarray(p["probabilities"]) - _offline(env, V2)).max() <= TOL


def _without_onnx(env, tmp_path, meta_update):
    """A copy of V1's dense directory without model.onnx, its model_meta.json's ``onnx``
    replaced by ``meta_update``."""
    d = tmp_path / "dense"
    shutil.copytree(env["dirs"][V1], d)
    (d / "model.onnx").unlink()
    meta = ModelMeta.read(d).model_copy(update={"onnx": meta_update})
    meta.write(d)
    return d


@pytest.mark.parametrize("record", [None, OnnxExport(converter="paddle2onnx 2.1.0", error="conversion: unsupported op")],
                         ids=["exported-without-onnx", "conversion-failed"])
def test_onnx_backend_falls_back_to_paddle_for_a_version_without_model_onnx(env, tmp_path, record):
    d = _without_onnx(env, tmp_path, record)
    m = DenseModel(V1, d, pool_size=1, dense_backend=dense_backends.ONNXRUNTIME)
    assert m.backend == dense_backends.PADDLE and f"version {V1} has no ONNX model" in m.fallback
    if record is not None:
        assert "unsupported op" in m.fallback
    b = env["batch"]
    from runtime.formats import features

    emb = np.stack([env["tables"][V1].get(int(k), np.zeros(4, np.float32)) for k in b.feasigns[:N].T.ravel()])
    got = m.predict(features.normalize_dense(b.dense[:N]), emb.astype(np.float32)).ravel()
    assert np.abs(got - _offline(env)).max() <= TOL


def test_onnx_backend_without_paddle_refuses_such_a_version_naming_why(env, tmp_path, monkeypatch):
    d = _without_onnx(env, tmp_path, OnnxExport(converter="paddle2onnx 2.1.0", error="check: differ by 0.3"))
    monkeypatch.setattr(dense_backends, "paddle_installed", lambda: False)
    with pytest.raises(ModelLoadError, match="differ by 0.3.*Paddle Inference.*not installed.*serving-paddle"):
        DenseModel(V1, d, pool_size=1, dense_backend=dense_backends.ONNXRUNTIME)
    with pytest.raises(ModelLoadError, match="'paddle' asked for, and Paddle is not installed"):
        DenseModel(V1, env["dirs"][V1], pool_size=1, dense_backend=dense_backends.PADDLE)
    # a version with model.onnx needs no Paddle at all
    assert DenseModel(V1, env["dirs"][V1], pool_size=1).backend == dense_backends.ONNXRUNTIME


def test_dense_backend_unknown_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="dense backend 'tensorrt': expected one of onnxruntime, paddle"):
        VersionWatcher(str(tmp_path), None, tmp_path / "work", dense_backend="tensorrt")
