"""``elastic-ctr serve`` stopped by SIGTERM while large requests are in flight, as the
kubelet stops a serving pod: with one worker, and with two (stopped several times over,
both workers exiting at once).

Every request sent before the signal is answered 200 with the probabilities a request
answered before the stop gave: half of them still have part of their body unsent when
the signal arrives (so they are certainly in flight), the other half were written to the
socket just before it (uvicorn's own stop closes a connection whose request it has not
read yet: the worker reads what was sent first). Readiness turns false while the process
is still up, it exits 0 within the bound, and its output has its start line and no
traceback, Paddle ``FatalError`` or ``ImportError``.

Under keep-alive traffic (``requests.Session`` clients sending continuously through the
SIGTERM, as the container resize test's client does) serving exits well before its
graceful timeout: its workers end at once after their last answer, skipping the
interpreter's C-level finalization (seconds under load, beyond the grace at worst).
"""
from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest
import requests

from runtime import proc
from tests.helpers import serving_args
from tests.lifecycle import support

pytestmark = pytest.mark.slow

ROWS = 4096          # rows per request: serving's default --max-batch
IN_FLIGHT = 8        # requests in flight at the signal
STOPS_TWO_WORKERS = 4


@pytest.fixture(scope="module")
def cube(tmp_path_factory):
    """A version exported by the trainer's export, rolled out to a local cube (1 shard x 1
    replica, its transfer and file server): what serving needs to become ready."""
    from tests.helpers import cube_serving_lines

    tmp = tmp_path_factory.mktemp("serving-stop")
    lines = support.criteo_lines(ROWS)
    version = 1_800_000_100
    with cube_serving_lines(tmp, lines, version) as (c, batch):
        yield {"cluster": c, "lines": lines, "batch": batch, "version": version, "tmp": tmp}


def _bodies(cube) -> list[tuple[str, bytes, dict]]:
    """``IN_FLIGHT`` requests of ``ROWS`` rows each, alternately ``/predict`` (raw lines)
    and the v2 infer endpoint (JSON tensors): (path, body, headers)."""
    b = cube["batch"]
    predict = json.dumps({"lines": cube["lines"]}).encode()
    dense = [None if np.isnan(x) else float(x) for x in b.dense.ravel()]
    infer = json.dumps({"id": "stop", "inputs": [
        {"name": "dense_features", "datatype": "FP32", "shape": [ROWS, 13], "data": dense},
        {"name": "feasigns", "datatype": "UINT64", "shape": [ROWS, 26], "data": [int(x) for x in b.feasigns.ravel()]},
    ]}).encode()
    js = {"Content-Type": "application/json"}
    return [("/predict", predict, js) if i % 2 == 0 else ("/v2/models/ctr/infer", infer, js) for i in range(IN_FLIGHT)]


def _probabilities(path: str, body: bytes) -> list[float]:
    doc = json.loads(body)
    return doc["probabilities"] if path == "/predict" else doc["outputs"][0]["data"]


class _Request(threading.Thread):
    """One POST over its own connection. ``split``: send only the headers and the first
    half of the body, then wait for ``go`` before sending the rest (the request is then
    in flight whatever the timing). ``result``: (status, body, monotonic time answered)
    or the exception."""

    def __init__(self, port: int, path: str, body: bytes, headers: dict, split: bool, go: threading.Event):
        super().__init__(daemon=True)
        self.port, self.path, self.body, self.headers, self.split, self.go = port, path, body, headers, split, go
        self.sent_head = threading.Event()
        self.result = None

    def run(self) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.putrequest("POST", self.path)
            for k, v in {**self.headers, "Content-Length": str(len(self.body))}.items():
                c.putheader(k, v)
            c.endheaders()
            half = len(self.body) // 2 if self.split else len(self.body)
            c.send(self.body[:half])
            self.sent_head.set()
            if self.split:
                self.go.wait(30)
                c.send(self.body[half:])
            r = c.getresponse()
            self.result = (r.status, r.read(), time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.sent_head.set()
            self.result = exc
        finally:
            c.close()


def _serve(cube, group: proc.ProcessGroup, name: str, workers: int) -> tuple[proc.Role, int, int]:
    c = cube["cluster"]
    role = support.start(group, name, serving_args(c, cube["tmp"] / f"work-{name}", workers, threads=2))
    bound = group.bound_ports(role, 120)
    port, grpc_port = bound["http"], bound["grpc"]
    support.wait_ready(role, f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=120)
    return role, port, grpc_port


def _stop_in_flight(cube, group: proc.ProcessGroup, name: str, workers: int) -> dict:
    """Starts serving, sends ``IN_FLIGHT`` large requests, SIGTERM, checks everything;
    returns timings."""
    role, port, _ = _serve(cube, group, name, workers)
    url = f"http://127.0.0.1:{port}"
    bodies = _bodies(cube)
    ref = requests.post(url + "/predict", json={"lines": cube["lines"]}, timeout=60)
    assert ref.status_code == 200, ref.text
    want = np.array(ref.json()["probabilities"])
    assert want.shape == (ROWS,) and ref.json()["model_version"] == cube["version"]

    go = threading.Event()
    reqs = [_Request(port, p, b, h, split=i < IN_FLIGHT // 2, go=go) for i, (p, b, h) in enumerate(bodies)]
    split, whole = reqs[:IN_FLIGHT // 2], reqs[IN_FLIGHT // 2:]
    for r in split:
        r.start()
    for r in split:
        assert r.sent_head.wait(30)
    time.sleep(0.5)  # the split requests are being read by worker threads: certainly in flight
    for r in whole:  # these are sent just before the signal (written to the socket, maybe not yet read)
        r.start()
    for r in whole:
        assert r.sent_head.wait(30)
    watch = support.StopWatch(role, url + "/v2/health/ready")
    t_signal = watch.start()
    time.sleep(0.3)
    go.set()  # the split requests send the rest of their bodies now, after the signal
    for r in reqs:
        r.join(60)
    stop = watch.result()

    failures = [(r.path, r.result if isinstance(r.result, Exception) else r.result[:2][0]) for r in reqs
                if isinstance(r.result, Exception) or r.result is None or r.result[0] != 200]
    assert not failures, f"{name}: requests in flight at SIGTERM failed: {failures}; log:\n" \
                         f"{proc.tail(role.log_path, 60)}"
    for r in reqs:
        got = np.array(_probabilities(r.path, r.result[1]))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {r.path}")
    after = [r.result[2] - t_signal for r in reqs]
    assert sum(a > 0 for a in after) >= IN_FLIGHT // 2, f"{name}: answered before the signal: {after}"
    support.check_stop(stop, role)
    support.check_log(role, "127.0.0.1", [port])
    return {"exit_s": round(stop.seconds, 2), "last_answer_s": round(max(after), 2),
            "probes": [p[1] for p in stop.probes]}


def test_one_worker_finishes_requests_in_flight_on_sigterm(cube, tmp_path):
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        timings = _stop_in_flight(cube, group, "serving-w1", workers=1)
    print("one worker:", timings)


def test_two_workers_finish_requests_in_flight_on_sigterm_every_time(cube, tmp_path):
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        for i in range(STOPS_TWO_WORKERS):
            timings = _stop_in_flight(cube, group, f"serving-w2-{i}", workers=2)
            print(f"two workers, stop {i}:", timings)


KEEPALIVE_CLIENTS = 8
#: a serving pod's drain bound under keep-alive traffic: well below --grace-period-seconds (20 s)
KEEPALIVE_DRAIN_BOUND_S = 8.0


class _Sender(threading.Thread):
    """POSTs ``/predict`` over one ``requests.Session`` (keep-alive) continuously until a
    connection is refused. ``ok``: answers 200 (``after``: of them, answered after
    ``t_signal``); ``bad``: other statuses; ``lost``: other errors."""

    def __init__(self, url: str, lines: list[str]):
        super().__init__(daemon=True)
        self.url, self.body = url, {"lines": lines}
        self.ok = self.after = 0
        self.t_signal: float | None = None
        self.bad: list[int] = []
        self.lost: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + 120
        with requests.Session() as s:
            while time.monotonic() < deadline:
                try:
                    r = s.post(self.url + "/predict", json=self.body, timeout=30)
                except requests.ConnectionError as exc:
                    if "refused" in str(exc).lower():
                        return
                    self.lost.append(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code == 200:
                    self.ok += 1
                    self.after += self.t_signal is not None and time.monotonic() > self.t_signal
                else:
                    self.bad.append(r.status_code)


class _GrpcCaller(threading.Thread):
    """Calls ``ServerLive`` over one gRPC channel continuously until the server stops
    taking calls (``end``: ``UNAVAILABLE`` or ``CANCELLED``). ``ok``: calls answered;
    ``errors``: other failures."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.ok = 0
        self.end = ""
        self.errors: list[str] = []

    def run(self) -> None:
        import grpc

        from runtime.serving.proto import open_inference_pb2 as pb
        from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc

        deadline = time.monotonic() + 120
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            while time.monotonic() < deadline:
                try:
                    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
                    self.ok += 1
                except grpc.RpcError as exc:
                    # UNAVAILABLE: refused; CANCELLED: a call that reached gRPC's core as it shut
                    # down, before any handler took it (seen once in ~10 stops; not in flight)
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                        self.end = exc.code().name
                        return
                    self.errors.append(f"{exc.code()}: {exc.details()}")


def test_stop_under_keepalive_traffic_ends_well_before_the_grace(cube, tmp_path):
    """``KEEPALIVE_CLIENTS`` clients keep sending over keep-alive connections (and one
    gRPC caller over its channel) through the SIGTERM: serving exits 0 well before its graceful timeout (the pods of the container
    resize test were SIGKILLed at the end of theirs), every request answered 200 or
    refused a connection (at most one lost per client: a request sent on a connection
    closed while idle)."""
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        role, port, grpc_port = _serve(cube, group, "serving-keepalive", workers=2)
        url = f"http://127.0.0.1:{port}"
        senders = [_Sender(url, cube["lines"][:64]) for _ in range(KEEPALIVE_CLIENTS)]
        caller = _GrpcCaller(grpc_port)
        for s in [*senders, caller]:
            s.start()
        deadline = time.monotonic() + 60
        while not (all(s.ok for s in senders) and caller.ok) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(s.ok for s in senders), f"not every client answered: {[s.bad + s.lost for s in senders]}"
        time.sleep(1.0)
        watch = support.StopWatch(role, url + "/v2/health/ready")
        t_signal = watch.start()
        for s in senders:
            s.t_signal = t_signal
        stop = watch.result()
        for s in [*senders, caller]:
            s.join(30)
        summary = {"exit_s": round(stop.seconds, 2), "ok": sum(s.ok for s in senders), "grpc_ok": caller.ok,
                   "grpc_end": caller.end, "grpc_errors": caller.errors,
                   "ok_after_signal": sum(s.after for s in senders), "lost": [x for s in senders for x in s.lost],
                   "bad": [b for s in senders for b in s.bad]}
        print("keep-alive stop:", summary)
        support.check_stop(stop, role, bound_s=KEEPALIVE_DRAIN_BOUND_S)
        assert not summary["bad"], summary
        assert all(len(s.lost) <= 1 for s in senders), summary
        assert not any(s.is_alive() for s in senders), "every client ends refused"
        assert not caller.is_alive() and not caller.errors, f"gRPC calls end refused only: {summary}"
        support.check_log(role, "127.0.0.1", [port])
