"""Serving under overload and slow clients.

In process, with the data plane's inference held: beyond the queue limit a REST inference
request (served as serving's workers serve it: ``runtime.serving.asgi.ServingApp`` on
uvicorn, ``tests/serving/server.py``) is answered 503 with ``Retry-After`` and a JSON
error at once, a gRPC ``ModelInfer`` ``RESOURCE_EXHAUSTED``, and health and readiness keep
answering on both transports; the refusals are counted in the metrics.

As a real ``elastic-ctr serve`` (the supervisor and its uvicorn workers) over a local cube: with
64 slow clients open, ``/v2/health/live``, ``/v2/health/ready`` and an inference are
answered within their usual latency; with more concurrent large requests than one worker
thread and a queue of 2 can take, some are answered 503 with ``Retry-After``, every other
one 200, and the probes answer meanwhile.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import requests

from runtime import proc
from runtime.serving.grpc_server import GrpcServer
from runtime.serving.proto import open_inference_pb2 as pb
from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc
from runtime.web.limits import ServerLimits
from runtime.serving.asgi import Inline, ServingApp
from runtime.serving.rest import create_app
from tests.helpers import wait_until
from tests.serving.server import ServingThread
from tests.slow_clients import check_answered, latency


def _hold(plane):
    """Makes ``plane.infer`` wait for the returned event (then run as usual); returns
    (event, number of calls entered)."""
    release, entered = threading.Event(), []
    infer = plane.infer

    def held(*a, **kw):
        entered.append(1)
        release.wait(20)
        return infer(*a, **kw)

    plane.infer = held
    return release, entered


def _infer_json(b, n: int) -> dict:
    return {"inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [n, 13],
         "data": np.nan_to_num(b.dense[:n]).ravel().tolist()},
        {"name": "feasigns", "datatype": "UINT64", "shape": [n, 26], "data": [int(x) for x in b.feasigns[:n].ravel()]}]}


def test_rest_beyond_the_queue_limit_answers_503_at_once(served, env):
    plane = served["plane"]
    app = ServingApp(create_app(plane), ServerLimits(max_queue=2), threads=1, inline=Inline(max_bytes=0))  # held: on the thread
    release, entered = _hold(plane)
    body = _infer_json(env["batch"], 4)
    with ServingThread(app, app.limits) as w:
        url = w.url + "/v2/models/ctr/infer"
        with ThreadPoolExecutor(3) as pool:
            first = [pool.submit(requests.post, url, json=body, timeout=30)]
            assert wait_until(lambda: entered), "one running"
            first += [pool.submit(requests.post, url, json=body, timeout=30) for _ in range(2)]
            assert wait_until(lambda: app.queued() == 2), "two waiting"
            t0 = time.perf_counter()
            r = requests.post(url, json=body, timeout=5)
            took = time.perf_counter() - t0
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", (r.status_code, r.headers, r.text)
            assert r.json()["error"] == ("POST /v2/models/ctr/infer: overloaded, 2 requests are already waiting "
                                         "(queue limit 2); retry later") and took < 1.0
            assert latency(w.url + "/v2/health/live") < 1.0 and latency(w.url + "/v2/health/ready") < 1.0
            release.set()
            assert [f.result().status_code for f in first] == [200, 200, 200]
        metrics = requests.get(w.url + "/metrics", timeout=5).text
    assert 'elastic_ctr_serving_requests_total{code="503",endpoint="overloaded"} 1.0' in metrics
    assert 'elastic_ctr_serving_errors_total{kind="unavailable"} 1.0' in metrics


def test_grpc_beyond_the_queue_limit_answers_resource_exhausted(served, env):
    plane = served["plane"]
    release, entered = _hold(plane)
    server = GrpcServer(plane, "127.0.0.1", 0, threads=1, max_queue=1).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    b = env["batch"]
    req = pb.ModelInferRequest(model_name="ctr")
    req.inputs.add(name="dense_features", datatype="FP32", shape=[2, 13]).contents.fp32_contents.extend(
        np.nan_to_num(b.dense[:2]).ravel().tolist())
    req.inputs.add(name="feasigns", datatype="UINT64", shape=[2, 26]).contents.uint64_contents.extend(
        b.feasigns[:2].ravel().tolist())
    try:
        running = stub.ModelInfer.future(req, timeout=30)
        assert wait_until(lambda: len(entered) == 1)
        waiting = stub.ModelInfer.future(req, timeout=30)
        assert wait_until(lambda: _admitted(server) == 2)
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as exc:
            stub.ModelInfer(req, timeout=5)
        took = time.perf_counter() - t0
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.value
        assert "queue limit 1" in exc.value.details() and took < 1.0
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=2).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=2).ready
        release.set()
        assert running.result().model_version and waiting.result().model_version
    finally:
        release.set()
        channel.close()
        server.stop(grace_s=1)


def _admitted(server: GrpcServer) -> int:
    return server.servicer._admitted


# -- a real serving process -----------------------------------------------------------------------
ROWS = 512


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """``elastic-ctr serve`` (1 worker, 1 thread, queue limit 2) over a local cube holding
    a version exported by the trainer's export."""
    from tests.helpers import cube_serving_lines, serving_args
    from tests.lifecycle import support

    tmp = tmp_path_factory.mktemp("overload")
    lines = support.criteo_lines(ROWS)
    version = 1_800_000_200
    with cube_serving_lines(tmp, lines, version) as (c, batch), \
            proc.ProcessGroup(tmp / "logs", grace_s=10) as group:
        role = support.start(group, "serving", serving_args(c, tmp / "work", workers=1, threads=1,
                                                            extra=("--max-queue", "2")))
        url = f"http://127.0.0.1:{group.bound_ports(role, 120)['http']}"
        support.wait_ready(role, url + "/v2/health/ready", timeout_s=120)
        yield {"url": url, "lines": lines, "batch": batch, "role": role, "cube": c}


@pytest.mark.slow
def test_serving_answers_with_64_slow_clients(serving):
    u = serving["url"]
    body = _infer_json(serving["batch"], 8)
    out = check_answered({"live": lambda: latency(u + "/v2/health/live"),
                          "ready": lambda: latency(u + "/v2/health/ready"),
                          "infer": lambda: latency(u + "/v2/models/ctr/infer", json=body)}, u)
    print("serving", out)


@pytest.mark.slow
def test_probes_answer_while_a_request_waits_on_a_hung_cube(serving):
    """With the cube server stopped (SIGSTOP): the first small request to wait on it may
    run on the worker's event loop (a small request on an idle worker:
    ``runtime.serving.asgi.Inline``), so a probe meanwhile waits at most the cube client's
    timeouts (3 x 200 ms), once. That request took beyond the inline budget: for the
    backoff after it, requests wait for the cube on the worker's inference thread and the
    loop answers liveness probes as fast as ever; serving answers again once the cube is
    back."""
    u = serving["url"]
    body = _infer_json(serving["batch"], 4)
    s = requests.Session()
    assert s.post(u + "/v2/models/ctr/infer", json=body, timeout=10).status_code == 200
    (server,) = serving["cube"].servers.values()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(requests.post, u + "/v2/models/ctr/infer", json=body, timeout=30)
            time.sleep(0.05)  # waiting for the cube, on the loop or on the thread
            probe = latency(u + "/v2/health/live")
            assert first.result().status_code == 503
            assert probe < 1.0, f"a liveness probe while the first request waited on the cube: {probe:.2f} s"
            lone = pool.submit(requests.post, u + "/v2/models/ctr/infer", json=body, timeout=30)
            time.sleep(0.05)  # on the inference thread now, waiting for the cube
            probes = []
            while not lone.done() and len(probes) < 20:  # the cube client's timeouts: 3 x 200 ms
                probes.append(latency(u + "/v2/health/live"))
            assert len(probes) >= 3, f"the request did not wait for the stopped cube: {probes}"
            assert max(probes) < 0.1, f"liveness probes while a request waited on the cube (s): {probes}"
            os.kill(server.proc.pid, signal.SIGCONT)
            assert lone.result().status_code in (200, 503)  # the cube's timeout may have passed
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while s.post(u + "/v2/models/ctr/infer", json=body, timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "serving did not answer again after the cube came back"
        time.sleep(0.2)
    # the slow request turned inlining off (unless an earlier one had, less than a backoff before)
    metrics = s.get(u + "/metrics", timeout=10).text
    (backoffs,) = re.findall(r"^elastic_ctr_serving_inline_backoffs_total (\S+)$", metrics, re.M)
    assert float(backoffs) >= 1, metrics


def test_readiness_on_a_hung_cube_answers_at_once(serving):
    """With the cube server stopped (SIGSTOP), a request fails once the cube's timeouts
    have passed (503), and readiness then asks cube again on a thread of its own: each
    readiness probe answers "not ready" within ``READY_CHECK_WAIT_S`` and a bit, not after
    the client's timeouts and retries (600 ms) on the worker's event loop, and liveness
    probes meanwhile answer as fast as ever. Readiness turns true again once the cube
    answers."""
    from runtime.serving.ctr_model import READY_CHECK_WAIT_S

    u = serving["url"]
    body = _infer_json(serving["batch"], 4)
    (server,) = serving["cube"].servers.values()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        r = requests.post(u + "/v2/models/ctr/infer", json=body, timeout=30)
        assert r.status_code == 503 and "cube" in r.json()["error"], r.text
        ready, live = [], []
        for _ in range(6):
            t0 = time.perf_counter()
            r = requests.get(u + "/v2/health/ready", timeout=10)
            ready.append(time.perf_counter() - t0)
            assert r.status_code == 400 and r.json()["ready"] is False, r.text
            live.append(latency(u + "/v2/health/live"))
        assert max(ready) < READY_CHECK_WAIT_S + 0.1, f"readiness probes on a hung cube (s): {ready}"
        assert max(live) < 0.1, f"liveness probes on a hung cube (s): {live}"
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert wait_until(lambda: requests.get(u + "/v2/health/ready", timeout=10).status_code == 200, 10.0), \
        "readiness did not turn true after the cube came back"
    assert requests.post(u + "/v2/models/ctr/infer", json=body, timeout=10).status_code == 200


@pytest.mark.slow
def test_serving_overloaded_answers_503_and_probes_answer(serving):
    u = serving["url"]
    body = json.dumps({"lines": serving["lines"]}).encode()
    probes: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            probes.append(latency(u + "/v2/health/ready"))
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    with ThreadPoolExecutor(16) as pool:
        rs = list(pool.map(lambda _: requests.post(u + "/predict", data=body, timeout=60,
                                                   headers={"Content-Type": "application/json"}), range(48)))
    stop.set()
    prober.join(5)
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= 3, codes
    assert all(r.headers.get("Retry-After") == "1" for r in rs if r.status_code == 503)
    assert probes and max(probes) < 1.0, f"readiness probes during the overload (s): {probes}"
    assert all(math.isfinite(p) for p in probes)
    print(f"overload: {codes.count(503)} of {len(codes)} answered 503; readiness probes max "
          f"{max(probes) * 1e3:.1f} ms over {len(probes)}")
