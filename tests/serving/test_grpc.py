"""Serving's gRPC transport with the project's stubs: typed contents (as KServe's clients
send), raw contents, the version named in every answer, status codes for bad input, an
unknown model, no version yet and cube down, readiness, and the calls counted in metrics.
(Triton's own client is in test_tritonclient.py.)"""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from runtime.serving.grpc_server import GrpcServer
from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc
from tests.helpers import V1


@pytest.fixture
def stub(served):
    server = GrpcServer(served["plane"], "127.0.0.1", 0, threads=4).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()
    server.stop(grace_s=1)


def _typed(b, n, dense_dtype="FP32"):
    req = pb.ModelInferRequest(model_name="ctr", id="t1")
    d = req.inputs.add(name="dense_features", datatype=dense_dtype, shape=[n, 13])
    d.contents.fp32_contents.extend(np.nan_to_num(b.dense[:n]).ravel().tolist())
    f = req.inputs.add(name="feasigns", datatype="UINT64", shape=[n, 26])
    f.contents.uint64_contents.extend(b.feasigns[:n].ravel().tolist())
    return req


def test_typed_and_raw_contents_answer_as_predict(served, env, stub):
    b = env["batch"]
    want = served["client"].post("/predict", json={"lines": env["lines"][:8]}).json["probabilities"]
    typed = stub.ModelInfer(_typed(b, 8))
    assert typed.model_version == str(V1) and typed.id == "t1" and not typed.raw_output_contents
    assert typed.parameters["model_version"].int64_param == V1 == typed.parameters["cube_version"].int64_param
    (out,) = typed.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("probability", "FP32", [8, 1])
    np.testing.assert_allclose(out.contents.fp32_contents, want, rtol=1e-6)
    raw = pb.ModelInferRequest(model_name="ctr")
    raw.inputs.add(name="dense_features", datatype="FP32", shape=[8, 13])
    raw.inputs.add(name="feasigns", datatype="UINT64", shape=[8, 26])
    raw.raw_input_contents.extend([np.nan_to_num(b.dense[:8]).astype("<f4").tobytes(),
                                   b.feasigns[:8].astype("<u8").tobytes()])
    r = stub.ModelInfer(raw)
    np.testing.assert_allclose(np.frombuffer(r.raw_output_contents[0], "<f4"), want, rtol=1e-6)


@pytest.mark.parametrize("mutate, code, needle", [
    (lambda r: r.inputs[0].contents.fp32_contents.__setitem__(3, float("nan")), grpc.StatusCode.INVALID_ARGUMENT,
     "inputs[0]: element 3 (index [0, 3]) is nan"),
    (lambda r: r.inputs[1].contents.uint64_contents.pop(), grpc.StatusCode.INVALID_ARGUMENT,
     "inputs[1]: 51 elements, but shape [2, 26] needs 52"),
    (lambda r: r.raw_input_contents.append(b"x"), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents: 1 entries"),
    (lambda r: setattr(r, "model_name", "nope"), grpc.StatusCode.NOT_FOUND, "model 'nope' not found"),
    (lambda r: r.inputs[0].__setattr__("datatype", "FP17"), grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype 'FP17'"),
])
def test_bad_requests_get_status_codes(env, stub, mutate, code, needle):
    req = _typed(env["batch"], 2)
    mutate(req)
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(req)
    assert exc.value.code() == code and needle in exc.value.details(), (exc.value.code(), exc.value.details())


def test_readiness_cube_down_and_metrics(served, env, stub):
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="ctr")).ready
    assert not stub.ModelReady(pb.ModelReadyRequest(name="ctr", version="42")).ready
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="ctr"))
    assert list(meta.versions) == [str(V1)] and [t.name for t in meta.outputs] == ["probability"]
    served["cube"].down = True
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(_typed(env["batch"], 2))
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and "cube lookup failed" in exc.value.details()
    assert not stub.ServerReady(pb.ServerReadyRequest()).ready
    served["cube"].down = False
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    text = served["client"].get("/metrics").data.decode()
    assert 'elastic_ctr_serving_requests_total{code="503",endpoint="grpc_ModelInfer"} 1.0' in text
    assert 'elastic_ctr_serving_requests_total{code="200",endpoint="grpc_ServerReady"} 3.0' in text


@pytest.mark.parametrize("age_s", [0.4, None])
def test_max_connection_age_reconnects_without_a_failed_call(served, env, age_s):
    """With a maximum connection age the server sends GOAWAY once a connection is that old
    and the client's channel connects again by itself (each new connection is hashed to a
    worker anew); no call fails meanwhile. Without one, the channel keeps its connection."""
    import time

    server = GrpcServer(served["plane"], "127.0.0.1", 0, threads=2, max_connection_age_s=age_s).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    states: list = []
    channel.subscribe(states.append, try_to_connect=True)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    try:
        calls, until = 0, time.monotonic() + 2.5
        while time.monotonic() < until:
            r = stub.ModelInfer(_typed(env["batch"], 2), timeout=10)
            assert r.model_version == str(V1)
            calls += 1
            time.sleep(0.01)
    finally:
        channel.close()
        server.stop(grace_s=1)
    ready = states.count(grpc.ChannelConnectivity.READY)
    assert calls > 20
    if age_s:
        assert ready >= 3, f"{ready} connections in 2.5 s at a maximum age of {age_s} s: {states}"
    else:
        assert ready == 1, states
