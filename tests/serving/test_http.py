"""Serving over HTTP as its workers serve it (``runtime.serving.asgi.ServingApp`` on
uvicorn, ``tests/serving/server.py``), with a stand-in for the REST endpoints that echoes
what it was sent: HTTP/1.1 as clients speak it (keep-alive, pipelining, chunked bodies,
``Expect: 100-continue``, ``HEAD``, HTTP/1.0), the limits on
clients (large bodies, bodies being received over all connections, malformed requests,
64 slow clients, a client that reads no answer), the queue limit, and the graceful stop
with keep-alive clients sending. Loopback only.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from runtime.web.limits import ServerLimits
from runtime.serving.asgi import Inline, ServingApp
from runtime.metrics.serving import ServingMetrics
from tests.lifecycle.test_keepalive_drain import CLIENTS, DRAIN_BOUND_S, GRACE_S, WORK_S, _Client
from tests.serving.server import ServingThread
from tests.slow_clients import check_answered, latency


class _Plane:
    stopping = False


class Echo:
    """Stands in for ``RestApp``: answers what it was sent (method, path, one header, the
    body's length and first bytes); ``/boom`` raises; ``/slow`` sleeps ``delay_s``; POSTs
    wait for ``gate`` when set."""

    def __init__(self, delay_s: float = 0.0):
        self.plane, self.metrics = _Plane(), ServingMetrics()
        self.delay_s = delay_s
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.threads: list[str] = []

    def respond(self, method, path, headers, body):
        self.threads.append(threading.current_thread().name)
        if method == "POST":
            self.entered.set()
            if self.gate is not None:
                self.gate.wait(20)
        if path == "/boom":
            raise RuntimeError("boom")
        if path == "/slow":
            time.sleep(self.delay_s)
        data = json.dumps({"method": method, "path": path, "x": headers.get("x-test"), "length": len(body),
                           "head": body[:16].decode("latin-1")}).encode()
        return 200, data, [("Content-Type", "application/json")]


#: every inference on the threads: most tests here hold or slow the work on purpose
THREADS_ONLY = Inline(max_bytes=0)


def _serve(rest=None, threads: int = 2, inline: Inline = THREADS_ONLY, **limits) -> tuple[ServingThread, ServingApp]:
    rest = rest or Echo()
    app = ServingApp(rest, ServerLimits(**{"max_body_bytes": 1000, **limits}), threads=threads, inline=inline)
    return ServingThread(app, app.limits), app


@pytest.fixture
def server():
    st, _ = _serve()
    with st:
        yield st


def _raw(server: ServingThread, data: bytes, until: int = 1, timeout_s: float = 5.0) -> list[tuple[bytes, dict, bytes]]:
    """Sends ``data`` on a new connection and reads ``until`` answers (or to EOF):
    ``[(status line, headers lower-cased, body)]``."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s)
    try:
        s.sendall(data)
        buf, out = b"", []
        while len(out) < until:
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                buf += chunk
            head, buf = buf.split(b"\r\n\r\n", 1)
            status, *lines = head.split(b"\r\n")
            headers = {k.strip().lower().decode(): v.strip().decode() for k, v in (x.split(b":", 1) for x in lines)}
            if status.split()[1] == b"100":
                continue
            n = 0 if data.startswith(b"HEAD") else int(headers.get("content-length", 0))
            while len(buf) < n:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            out.append((status, headers, buf[:n]))
            buf = buf[n:]
        return out
    finally:
        s.close()


def test_requests_and_keep_alive(server):
    with requests.Session() as s:
        for i in range(3):
            r = s.post(server.url + "/a%20b/c?x=1", data=b"z" * (100 + i), headers={"X-Test": "t"}, timeout=5)
            assert r.status_code == 200 and "date" in r.headers and r.headers.get("Connection") != "close"
            assert r.json() == {"method": "POST", "path": "/a b/c", "x": "t", "length": 100 + i, "head": "z" * 16}
    assert len(server.server.guard.conns) <= 1  # one connection for the three


def test_inference_runs_on_a_worker_thread_and_the_rest_on_the_loop(server):
    rest = server.app.rest
    assert requests.post(server.url + "/infer", data=b"x", timeout=5).status_code == 200
    assert requests.get(server.url + "/live", timeout=5).status_code == 200
    assert rest.threads[0].startswith("serving-infer") and not rest.threads[1].startswith("serving-infer")


def test_a_small_request_on_an_idle_worker_runs_on_the_loop_and_a_larger_one_on_a_thread():
    rest = Echo()
    st, app = _serve(rest, inline=Inline(max_bytes=64))
    with st, requests.Session() as s:
        assert s.post(st.url + "/small", data=b"s" * 64, timeout=5).json()["length"] == 64
        assert s.post(st.url + "/large", data=b"l" * 65, timeout=5).json()["length"] == 65
        assert s.post(st.url + "/small", data=b"s" * 10, timeout=5).json()["length"] == 10
    assert app.inlined == 2
    assert [t.startswith("serving-infer") for t in rest.threads] == [False, True, False]


def test_an_inline_request_over_its_budget_sends_inference_to_the_threads_for_the_backoff():
    """The guard of the inline path: a slow request on the loop (a slow cube replica) holds
    the loop once; for ``backoff_s`` after it every inference runs on a thread, so probes
    answer while it is slow; then small requests run inline again."""
    rest = Echo(delay_s=0.3)
    st, app = _serve(rest, inline=Inline(max_bytes=1000, budget_ms=100, backoff_s=2.0))
    with st, requests.Session() as s, ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        assert s.post(st.url + "/slow", data=b"x", timeout=5).status_code == 200
        assert app.inlined == 1 and app.inline_off_until > t0
        rest.entered.clear()
        slow = pool.submit(requests.post, st.url + "/slow", data=b"x", timeout=5)  # on a thread now
        assert rest.entered.wait(5)
        t1 = time.perf_counter()
        assert requests.get(st.url + "/live", timeout=5).status_code == 200
        assert time.perf_counter() - t1 < 0.2, "a probe answers while the slow request runs on a thread"
        assert slow.result().status_code == 200 and app.inlined == 1
        assert sum(t.startswith("serving-infer") for t in rest.threads) == 1  # the second slow one
        time.sleep(max(0.0, app.inline_off_until - time.monotonic()) + 0.05)
        assert s.post(st.url + "/fast", data=b"x", timeout=5).status_code == 200
        assert app.inlined == 2 and not rest.threads[-1].startswith("serving-infer")
    assert rest.metrics.registry.get_sample_value("elastic_ctr_serving_inline_backoffs_total") == 1


@pytest.mark.parametrize("field, value", [("max_bytes", -1), ("budget_ms", 0), ("backoff_s", float("nan"))])
def test_bad_inline_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        Inline(**{field: value})


def test_pipelined_requests_are_answered_in_order(server):
    reqs = b"".join(b"POST /p%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (i, i, b"b" * i)
                    for i in range(1, 6))
    out = _raw(server, reqs, until=5)
    assert [json.loads(b)["path"] for _, _, b in out] == [f"/p{i}" for i in range(1, 6)]
    assert [json.loads(b)["length"] for _, _, b in out] == [1, 2, 3, 4, 5]
    many = b"".join(b"GET /g%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(1000))
    out = _raw(server, many, until=1000, timeout_s=30)
    assert [json.loads(b)["path"] for _, _, b in out] == [f"/g{i}" for i in range(1000)]


def test_a_client_that_does_not_read_holds_a_bounded_buffer(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.setblocking(False)
    req = b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n" * 1000
    sent, t0 = 0, time.monotonic()
    try:  # pipelined requests for 2 s, no answer read: the server stops reading once its buffer is full
        while time.monotonic() - t0 < 2.0:
            try:
                sent += s.send(req)
            except BlockingIOError:
                time.sleep(0.01)
        held = max(c.transport.get_write_buffer_size() for c in server.server.guard.conns.values())
        print(f"answers buffered for a client that reads none: {held} bytes ({sent} bytes of requests sent)")
        assert held < 256 << 10, f"{held} bytes of answers buffered for a client that reads none ({sent} bytes sent)"
    finally:
        s.close()
    assert requests.get(server.url + "/after", timeout=5).json()["path"] == "/after"


def test_chunked_body_expect_continue_head_and_http10(server):
    chunked = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    (_, _, body), = _raw(server, chunked)
    assert json.loads(body)["length"] == 11 and json.loads(body)["head"] == "hello world"
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:  # Expect: 100-continue is answered before the body is sent
        s.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"abcd")
        assert b'"length": 4' in s.recv(1000)
    finally:
        s.close()
    (status, headers, body), = _raw(server, b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200") and int(headers["content-length"]) > 0 and body == b""
    out = _raw(server, b"GET /old HTTP/1.0\r\n\r\n", until=2)  # HTTP/1.0: closed after the answer
    assert len(out) == 1 and out[0][1]["connection"] == "close"


def test_bad_requests_are_refused_and_the_app_error_is_a_500(server):
    (status, headers, body), = _raw(server, b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413") and headers["connection"] == "close"
    assert "1001 bytes exceeds the limit of 1000" in json.loads(body)["error"]
    big_chunks = b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"a" * 512 \
        + b"\r\n" + b"200\r\n" + b"a" * 512 + b"\r\n0\r\n\r\n"
    (status, _, body), = _raw(server, big_chunks)
    assert status.startswith(b"HTTP/1.1 413") and "more than 1000 bytes" in json.loads(body)["error"]
    (status, headers, body), = _raw(server, b"BAD REQUEST LINE\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400")
    (status, headers, body), = _raw(server, b"GET /h HTTP/1.1\r\nX-Big: " + b"v" * (70 << 10) + b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431") and headers["connection"] == "close"  # above max_head_bytes
    r = requests.post(server.url + "/boom", data=b"x", timeout=5)  # on a worker thread, which lives on
    assert r.status_code == 500
    assert requests.get(server.url + "/after", timeout=5).json()["path"] == "/after"  # the server lives on


def test_a_stalled_body_and_a_silent_connection_are_closed_after_the_idle_timeout():
    st, _ = _serve(idle_timeout_s=0.5)
    with st:
        silent = socket.create_connection(("127.0.0.1", st.port), timeout=5)
        stalled = socket.create_connection(("127.0.0.1", st.port), timeout=5)
        try:
            stalled.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
            t0 = time.monotonic()
            assert b"HTTP/1.1 408" in stalled.recv(1000) and stalled.recv(1000) == b""  # answered, then closed
            assert silent.recv(1000) == b""  # closed
            assert 0.4 < time.monotonic() - t0 < 3.0
        finally:
            silent.close()
            stalled.close()
        assert requests.post(st.url + "/b", data=b"x", timeout=5).status_code == 200


def test_bodies_being_received_are_bounded_over_all_connections():
    st, app = _serve(max_buffered_bytes=1500)
    with st:
        first = socket.create_connection(("127.0.0.1", st.port), timeout=5)
        try:  # 900 bytes of a 1000-byte body held, the rest never sent
            first.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"a" * 900)
            deadline = time.monotonic() + 5
            while app.buffered < 900 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert app.buffered == 900
            (status, _, body), = _raw(st, b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"b" * 1000)
            assert status.startswith(b"HTTP/1.1 503") and "(limit 1500)" in json.loads(body)["error"]
            first.sendall(b"a" * 100)  # the first completes: answered, and no longer counted
            assert b'"length": 1000' in first.recv(1000)
            assert app.buffered == 0
            r = requests.post(st.url + "/c", data=b"c" * 1000, timeout=5)
            assert r.status_code == 200 and r.json()["length"] == 1000
        finally:
            first.close()
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        ServerLimits(max_body_bytes=1000, max_buffered_bytes=999)


def test_64_slow_clients_take_nothing_from_others():
    st, _ = _serve(threads=1)
    with st:
        out = check_answered({"get": lambda: latency(st.url + "/live"),
                              "post": lambda: latency(st.url + "/work", data=b"x" * 100)}, st.url)
    print("serving (uvicorn) with 64 slow clients (without, with) s:", out)


def test_beyond_the_queue_limit_inference_is_answered_503_at_once_and_probes_answer():
    rest = Echo()
    rest.gate = threading.Event()
    st, app = _serve(rest, threads=1, max_queue=2)
    with st, ThreadPoolExecutor(3) as pool:
        url = st.url + "/work"
        first = [pool.submit(requests.post, url, data=b"x", timeout=30)]
        assert rest.entered.wait(5)
        first += [pool.submit(requests.post, url, data=b"x", timeout=30) for _ in range(2)]
        deadline = time.monotonic() + 5
        while app.queued() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.queued() == 2
        t0 = time.perf_counter()
        with requests.Session() as s:
            r = s.post(url, data=b"x", timeout=5)
            took = time.perf_counter() - t0
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", (r.status_code, r.headers)
            assert "POST /work: overloaded, 2 requests are already waiting (queue limit 2)" in r.json()["error"]
            assert took < 1.0 and app.rejected == 1
            assert s.get(st.url + "/live", timeout=2).status_code == 200  # the connection stays open
        rest.gate.set()
        assert [f.result().status_code for f in first] == [200, 200, 200]


def test_stop_lets_go_of_keepalive_clients_that_keep_sending():
    """As ``WebServer``'s (``tests/lifecycle/test_keepalive_drain.py``): every answer
    while stopping says ``Connection: close``, the listening socket closes, the requests in
    flight finish, each client ends refused having lost at most one request (one sent on a
    connection closed while idle)."""
    st, _ = _serve(Echo(delay_s=WORK_S), threads=4, max_body_bytes=1 << 20, grace_period_s=GRACE_S)
    st.start()
    clients = [_Client(st.url, time.monotonic() + GRACE_S + 15, path="/slow") for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    time.sleep(1.0)
    assert all(c.ok > 0 for c in clients), "every client is answered before the stop"
    t0 = time.monotonic()
    st.stop()
    took = time.monotonic() - t0
    for c in clients:
        c.join(GRACE_S + 20)
    summary = {"stop_s": round(took, 2), "ok": sum(c.ok for c in clients), "closes": sum(c.closes for c in clients),
               "lost": sum(len(c.lost) for c in clients), "bad": [b for c in clients for b in c.bad]}
    print("keep-alive drain:", summary)
    assert took < DRAIN_BOUND_S, summary
    assert all(c.refused for c in clients) and not summary["bad"], summary
    assert summary["closes"] >= 1, f"answers while stopping say Connection: close: {summary}"
    assert all(len(c.lost) <= 1 for c in clients), [c.lost for c in clients]


def _pid_worker(port: int, started) -> None:
    """A worker process as serving's: its own ``SO_REUSEPORT`` socket on ``port``, the
    worker's HTTP server, an app answering its pid, until SIGTERM."""
    import os

    from runtime.serving.worker import http_server
    from runtime.web.stop import StopSignal

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = str(os.getpid()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    stop = StopSignal()
    server = http_server(app, "127.0.0.1", port, ServerLimits()).start()
    started.put(os.getpid())
    stop.wait()
    server.stop()


def test_keepalive_connections_spread_over_the_workers():
    """Two workers, each listening on the port with its own ``SO_REUSEPORT`` socket: 16
    keep-alive connections, opened one after the other, land on both (the kernel hashes
    each connection to a socket: all 16 on one of 2 has a chance of 2 in 65536), and each
    keeps answering from the worker it landed on."""
    import http.client
    import multiprocessing
    import os
    import signal

    from runtime.serving.launcher import reserve_port

    port, hold = reserve_port("127.0.0.1", 0)  # as serve's supervisor holds it for its workers
    ctx = multiprocessing.get_context("fork")
    started = ctx.Queue()
    workers = [ctx.Process(target=_pid_worker, args=(port, started), daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        pids = {started.get(timeout=30) for _ in workers}
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(16)]
        landed = []
        for c in conns:
            c.request("GET", "/")
            landed.append(int(c.getresponse().read()))
        for c, pid in zip(conns, landed):  # keep-alive: the same worker answers again
            c.request("GET", "/")
            assert int(c.getresponse().read()) == pid
            c.close()
        print("16 keep-alive connections per worker:", {p: landed.count(p) for p in pids})
        assert set(landed) == pids, landed
    finally:
        for w in workers:
            if w.pid:
                os.kill(w.pid, signal.SIGTERM)
        for w in workers:
            w.join(10)
        hold.close()
    assert [w.exitcode for w in workers] == [0, 0]
