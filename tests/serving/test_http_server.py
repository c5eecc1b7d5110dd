"""Serving's HTTP server (``runtime.serving.http_server.HttpServer``): HTTP/1.1 as clients
speak it (keep-alive, pipelining, chunked bodies, ``Expect: 100-continue``, ``HEAD``,
HTTP/1.0), the limits on clients (64 slow clients, large heads and bodies, malformed
requests), and the graceful stop with keep-alive clients sending. Loopback only. The
header timeout, the queue limit and the connection spreading are tested with
``WebServer``'s (``tests/common/test_slow_clients.py``, ``test_connection_share.py``).
"""
from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from runtime import bounded
from runtime.serving import http_server
from runtime.serving.http_server import HttpServer
from tests.lifecycle.test_keepalive_drain import CLIENTS, DRAIN_BOUND_S, GRACE_S, _app as _work_app, _Client
from tests.slow_clients import check_answered, latency


def _echo(environ, start_response):
    """Answers what it was sent: method, path, query, one header, the body's length and its
    first bytes; ``/boom`` raises."""
    if environ["PATH_INFO"] == "/boom":
        raise RuntimeError("boom")
    if environ["PATH_INFO"] == "/bad-header":  # not encodable in an HTTP header (latin-1)
        start_response("200 OK", [("X-Name", "\u2603")])
        return [b"x"]
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    data = json.dumps({"method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
                       "query": environ["QUERY_STRING"], "x": environ.get("HTTP_X_TEST"),
                       "length": len(body), "head": body[:16].decode("latin-1")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


@pytest.fixture(params=[None, 0.05], ids=["threads", "inline"])
def server(request):
    """The server with work requests on work threads, and on the loop thread (``inline_budget_s``)."""
    with HttpServer(_echo, threads=2, max_body_bytes=1000, header_timeout_s=1.0, name="test",
                    inline_budget_s=request.param) as w:
        yield w


def _raw(server: HttpServer, data: bytes, until: int = 1, timeout_s: float = 5.0) -> list[tuple[bytes, dict, bytes]]:
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
            n = int(headers.get("content-length", 0))
            while len(buf) < n and not data.startswith(b"HEAD"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            if data.startswith(b"HEAD"):
                n = 0
            out.append((status, headers, buf[:n]))
            buf = buf[n:]
        return out
    finally:
        s.close()


def test_requests_and_keep_alive(server):
    with requests.Session() as s:
        for i in range(3):
            r = s.post(server.url + "/a%20b/c?x=1&y=2", data=b"z" * (100 + i), headers={"X-Test": "t"}, timeout=5)
            assert r.status_code == 200 and "date" in r.headers and r.headers.get("Connection") != "close"
            assert r.json() == {"method": "POST", "path": "/a b/c", "query": "x=1&y=2", "x": "t",
                                "length": 100 + i, "head": "z" * 16}
    assert server.open_connections() <= 1


def test_pipelined_requests_are_answered_in_order(server):
    reqs = b"".join(b"POST /p%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (i, i, b"b" * i)
                    for i in range(1, 6))
    out = _raw(server, reqs, until=5)
    assert [json.loads(b)["path"] for _, _, b in out] == [f"/p{i}" for i in range(1, 6)]
    assert [json.loads(b)["length"] for _, _, b in out] == [1, 2, 3, 4, 5]
    many = b"".join(b"GET /g%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3000))  # answered by the loop
    out = _raw(server, many, until=3000, timeout_s=30)
    assert [json.loads(b)["path"] for _, _, b in out] == [f"/g{i}" for i in range(3000)]


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
        held = max(c.transport.get_write_buffer_size() for c in server.connections)
        print(f"answers buffered for a client that reads none: {held} bytes ({sent} bytes of requests sent)")
        assert held < 256 << 10, f"{held} bytes of answers buffered for a client that reads none ({sent} bytes sent)"
    finally:
        s.close()
    assert requests.get(server.url + "/after", timeout=5).json()["path"] == "/after"


def test_half_closed_client_gets_its_answers():
    def slow_first(environ, start_response):  # the end of input arrives while the first is in flight
        if environ["PATH_INFO"] == "/h0":
            time.sleep(0.3)
        return _echo(environ, start_response)

    def send_and_close(w: HttpServer, n: int) -> str:
        s = socket.create_connection(("127.0.0.1", w.port), timeout=5)
        try:
            s.sendall(b"".join(b"POST /h%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx" % i for i in range(n)))
            s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return data.decode()
        finally:
            s.close()

    with HttpServer(slow_first, threads=1) as w:
        one = send_and_close(w, 1)  # its end of input arrives while its one request runs
        three = send_and_close(w, 3)  # pipelined: reading paused behind the first
    assert '"path": "/h0"' in one, one
    assert [f"/h{i}" in three for i in range(3)] == [True] * 3, three


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
    kept = b"GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"  # unless it asks to keep it
    out = _raw(server, kept * 2, until=2)
    assert [h["connection"] for _, h, _ in out] == ["keep-alive", "keep-alive"]


def test_bad_requests_are_refused_and_the_app_error_is_a_500(server):
    (status, headers, body), = _raw(server, b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413") and headers["connection"] == "close"
    assert "1001 bytes exceeds the limit of 1000" in json.loads(body)["error"]
    big_chunks = b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"a" * 512 \
        + b"\r\n" + b"200\r\n" + b"a" * 512 + b"\r\n0\r\n\r\n"
    (status, _, body), = _raw(server, big_chunks)
    assert status.startswith(b"HTTP/1.1 413") and "more than 1000 bytes" in json.loads(body)["error"]
    (status, headers, body), = _raw(server, b"BAD REQUEST LINE\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400") and "malformed request" in json.loads(body)["error"]
    (status, headers, body), = _raw(server, b"GET /h HTTP/1.1\r\nX-Big: " + b"v" * (70 << 10) + b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431") and "exceed 65536 bytes" in json.loads(body)["error"]
    r = requests.get(server.url + "/boom", timeout=5)
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError"}
    r = requests.post(server.url + "/bad-header", data=b"x", timeout=5)  # on a work thread, which lives on
    assert r.status_code == 500 and r.json() == {"error": "internal error: UnicodeEncodeError"}
    assert requests.get(server.url + "/after", timeout=5).json()["path"] == "/after"  # the server lives on


def test_bodies_being_received_are_bounded_over_all_connections():
    with HttpServer(_echo, max_body_bytes=1000, max_buffered_bytes=1500) as w:
        first = socket.create_connection(("127.0.0.1", w.port), timeout=5)
        try:  # 900 bytes of a 1000-byte body held, the rest never sent
            first.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"a" * 900)
            deadline = time.monotonic() + 5
            while w.buffered < 900 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert w.buffered == 900
            (status, _, body), = _raw(w, b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"b" * 1000)
            assert status.startswith(b"HTTP/1.1 503") and "(limit 1500)" in json.loads(body)["error"]
            first.sendall(b"a" * 100)  # the first completes: answered, and no longer counted
            assert b'"length": 1000' in first.recv(1000)
            assert w.buffered == 0
            r = requests.post(w.url + "/c", data=b"c" * 1000, timeout=5)
            assert r.status_code == 200 and r.json()["length"] == 1000
        finally:
            first.close()
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        HttpServer(_echo, max_body_bytes=1000, max_buffered_bytes=999)


def test_64_slow_clients_take_nothing_from_others():
    with HttpServer(_echo, threads=1, header_timeout_s=10.0) as w:
        out = check_answered({"get": lambda: latency(w.url + "/live"),
                              "post": lambda: latency(w.url + "/work", data=b"x" * 100)}, w.url)
    print("http_server with 64 slow clients (without, with) s:", out)


def test_stop_lets_go_of_keepalive_clients_that_keep_sending():
    server = HttpServer(_work_app, threads=4, name="keepalive", shutdown_timeout_s=GRACE_S).start()
    clients = [_Client(server.url, time.monotonic() + GRACE_S + 15) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    time.sleep(1.0)
    assert all(c.ok > 0 for c in clients), "every client is answered before the stop"
    t0 = time.monotonic()
    server.stop()
    took = time.monotonic() - t0
    for c in clients:
        c.join(GRACE_S + 20)
    summary = {"stop_s": round(took, 2), "ok": sum(c.ok for c in clients), "closes": sum(c.closes for c in clients),
               "lost": sum(len(c.lost) for c in clients), "bad": [b for c in clients for b in c.bad]}
    print("keep-alive drain:", summary)
    assert took < DRAIN_BOUND_S, summary
    assert all(c.refused for c in clients) and not summary["bad"], summary
    assert summary["closes"] >= 1, f"answers while draining say Connection: close: {summary}"
    assert all(len(c.lost) <= 1 for c in clients), [c.lost for c in clients]


def test_lone_requests_run_on_the_loop_and_what_would_wait_goes_to_a_work_thread(monkeypatch):
    """With ``inline_budget_s`` a lone work request runs on the loop thread; one that would
    wait longer than the budget (``bounded.WouldBlock``) is run again on a work thread,
    probes are answered meanwhile, and requests stay off the loop for the cool-down."""
    monkeypatch.setattr(http_server, "INLINE_COOLDOWN_S", 0.5)
    ran: list[tuple[str, str]] = []
    release = threading.Event()

    def app(environ, start_response):
        path = environ["PATH_INFO"]
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if environ["REQUEST_METHOD"] == "POST":
            ran.append((path, threading.current_thread().name))
        if path == "/slow":
            left = bounded.remaining_s()
            if left is not None:  # a reply that does not come within the budget
                release.wait(left)
                raise bounded.WouldBlock("late")
            release.wait(10)  # on a work thread: waits as long as it takes
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [path.encode() + b":" + body]

    with HttpServer(app, threads=1, name="t", inline_budget_s=0.1) as w:
        s = requests.Session()
        assert [s.post(w.url + f"/a{i}", data=b"x%d" % i, timeout=5).text for i in range(3)] == \
            ["/a0:x0", "/a1:x1", "/a2:x2"]
        assert all(not name.startswith("t-work") for _, name in ran) and w.inlined == 3 and w.handed == 0
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(requests.post, w.url + "/slow", data=b"s", timeout=10)
            deadline = time.monotonic() + 5
            while not any(n.startswith("t-work") for p, n in ran if p == "/slow") and time.monotonic() < deadline:
                time.sleep(0.01)
            assert w.handed == 1, ran  # tried on the loop for 0.1 s, then handed over
            probes = [latency(w.url + "/live") for _ in range(5)]  # the work thread waits; the loop answers
            assert max(probes) < 0.1, probes
            release.set()
            assert slow.result().text == "/slow:s"  # the body read again, whole
        ran.clear()
        assert s.post(w.url + "/b", data=b"y", timeout=5).text == "/b:y"
        assert ran[-1][1].startswith("t-work")  # within the cool-down: a work thread
        time.sleep(0.6)
        assert s.post(w.url + "/c", data=b"z", timeout=5).text == "/c:z"
        assert not ran[-1][1].startswith("t-work")  # the loop took them back


def test_requests_beyond_the_inline_depth_go_to_the_work_threads():
    """While the loop runs one request, requests arriving on other connections wait for
    it: up to ``INLINE_DEPTH`` run on the loop after it, one more sends them all to the
    work threads, answered in full either way."""
    ran: list[str] = []

    def app(environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        ran.append(threading.current_thread().name)
        if environ["PATH_INFO"] == "/busy":
            time.sleep(0.3)  # CPU on the loop, as far as the loop can tell: the others arrive meanwhile
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]

    for extra, on_threads in ((http_server.INLINE_DEPTH, False), (http_server.INLINE_DEPTH + 2, True)):
        ran.clear()
        with HttpServer(app, threads=2, name="t", inline_budget_s=0.05) as w:
            socks = [socket.create_connection(("127.0.0.1", w.port), timeout=10) for _ in range(extra + 1)]
            time.sleep(0.1)  # every connection accepted
            socks[0].sendall(b"POST /busy HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n0")
            time.sleep(0.1)  # the loop runs it
            for i, s in enumerate(socks[1:], 1):
                s.sendall(b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%d" % (len(str(i)), i))
            for i, s in enumerate(socks):
                buf = b""
                while not buf.endswith(b"\r\n\r\n" + str(i).encode()):
                    chunk = s.recv(4096)
                    assert chunk, f"connection {i} closed before its answer"
                    buf += chunk
                s.close()
        assert len(ran) == extra + 1
        assert any(n.startswith("t-work") for n in ran) == on_threads, (extra, ran)
        assert not ran[0].startswith("t-work")  # the first ran on the loop


def test_with_many_connections_open_work_requests_stay_on_the_work_threads(monkeypatch):
    """Beyond ``INLINE_CONNECTIONS`` open connections a lone request runs on a work thread
    (the loop stays free for many clients); with fewer, on the loop again."""
    monkeypatch.setattr(http_server, "INLINE_CONNECTIONS", 3)
    ran: list[str] = []

    def app(environ, start_response):
        ran.append(threading.current_thread().name)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    with HttpServer(app, threads=1, name="t", inline_budget_s=0.05) as w:
        s = requests.Session()
        assert s.post(w.url + "/a", timeout=5).text == "ok"  # 1 connection
        idle = [socket.create_connection(("127.0.0.1", w.port), timeout=5) for _ in range(3)]
        deadline = time.monotonic() + 5
        while len(w.connections) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.post(w.url + "/b", timeout=5).text == "ok"  # 4 connections
        for c in idle:
            c.close()
        while len(w.connections) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.post(w.url + "/c", timeout=5).text == "ok"  # 1 again
    assert [n.startswith("t-work") for n in ran] == [False, True, False], ran
