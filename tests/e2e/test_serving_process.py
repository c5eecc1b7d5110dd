"""``elastic-ctr serve`` as a process, as it runs in a pod: uvicorn workers answering HTTP
and gRPC over a local cube (2 shards, the transfer rolling out a version the trainer's
export published). The same rows through JSON, binary tensors, gRPC and ``/predict`` get
the same answers; the metrics add up every worker's requests."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests

from runtime import proc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    from tests.helpers import cube_serving_lines, serving_args

    tmp = tmp_path_factory.mktemp("serving")
    rng = np.random.default_rng(0)
    lines = ["\t".join([str(i % 2)] + [str(int(rng.integers(0, 50))) for _ in range(13)]
                       + [format(int(rng.integers(0, 30)), "x") for _ in range(26)]) for i in range(32)]
    version = 1_800_000_000
    with cube_serving_lines(tmp, lines, version, shards=2) as (cube, batch):
        role = cube.group.start("serving", proc.self_command() + serving_args(
            cube, tmp / "sv", workers=2, threads=2), port_file=True)
        bound = cube.group.bound_ports(role, 120)  # every port accepts from now on
        port, grpc_port = bound["http"], bound["grpc"]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            cube.group.check()
            try:
                if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # workers still loading: the backlog holds it
                pass
            time.sleep(0.2)
        yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}", "lines": lines, "batch": batch, "version": version,
               "role": role, "group": cube.group}


def test_every_transport_answers_alike_and_metrics_add_up(serving):
    import grpc

    from runtime.serving.proto import open_inference_pb2 as pb
    from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc

    url, b, n = serving["url"], serving["batch"], 16
    want = requests.post(url + "/predict", json={"lines": serving["lines"][:n]}).json()
    assert want["model_version"] == serving["version"]
    dense = np.nan_to_num(b.dense[:n]).astype("<f4")
    fs = b.feasigns[:n].astype("<u8")
    sent = 0
    for _ in range(6):  # enough requests for both workers to answer some
        r = requests.post(url + "/v2/models/ctr/infer", json={"inputs": [
            {"name": "dense_features", "datatype": "FP32", "shape": [n, 13], "data": dense.ravel().tolist()},
            {"name": "feasigns", "datatype": "UINT64", "shape": [n, 26], "data": fs.ravel().tolist()}]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["outputs"][0]["data"], want["probabilities"], rtol=1e-6)
        sent += 1
    head = json.dumps({"inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [n, 13], "parameters": {"binary_data_size": dense.nbytes}},
        {"name": "feasigns", "datatype": "UINT64", "shape": [n, 26], "parameters": {"binary_data_size": fs.nbytes}}],
        "parameters": {"binary_data_output": True}}).encode()
    r = requests.post(url + "/v2/models/ctr/infer", data=head + dense.tobytes() + fs.tobytes(),
                      headers={"Inference-Header-Content-Length": str(len(head))})
    sent += 1
    hl = int(r.headers["Inference-Header-Content-Length"])
    np.testing.assert_allclose(np.frombuffer(r.content[hl:], "<f4"), want["probabilities"], rtol=1e-6)
    with grpc.insecure_channel(serving["grpc"]) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="ctr")
        req.inputs.add(name="dense_features", datatype="FP32", shape=[n, 13])
        req.inputs.add(name="feasigns", datatype="UINT64", shape=[n, 26])
        req.raw_input_contents.extend([dense.tobytes(), fs.tobytes()])
        for _ in range(4):
            g = stub.ModelInfer(req)
            assert g.model_version == str(serving["version"])
            np.testing.assert_allclose(np.frombuffer(g.raw_output_contents[0], "<f4"), want["probabilities"], rtol=1e-6)
    text = requests.get(url + "/metrics").text
    counts = {}
    for ln in text.splitlines():
        if ln.startswith("elastic_ctr_serving_requests_total{") and 'code="200"' in ln:
            endpoint = ln.split('endpoint="')[1].split('"')[0]
            counts[endpoint] = counts.get(endpoint, 0) + float(ln.split()[-1])
    assert counts.get("infer") == sent and counts.get("grpc_ModelInfer") == 4 and counts.get("predict") == 1, counts
