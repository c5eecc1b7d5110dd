"""No HTTP role is wedged by slow clients: with 64 connections open that
send request headers one line per second, the probes and other requests of the server
are answered within their usual latency (tests.slow_clients). The file server, the cube
agent and the cube transfer serve their Flask apps through ``runtime.web.wsgi.WebServer``
(tested here with the real apps, and once as a real file-server process); the cube
server's control port through the same class inside a real cube server. Also, for
``WebServer`` and serving's uvicorn workers (``runtime.serving.asgi.ServingApp``,
``tests/serving/server.py``) alike, both taking one ``runtime.web.limits.ServerLimits``: a
connection whose headers do not finish is closed after the header timeout, requests
beyond the work queue limit are answered 503 with Retry-After at once while probes
answer, and bad settings are refused by name."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from runtime import proc
from runtime.web.limits import ServerLimits
from runtime.serving.asgi import Inline, ServingApp
from runtime.metrics.serving import ServingMetrics
from runtime.web.wsgi import WebServer
from tests.serving.server import ServingThread
from tests.slow_clients import SlowClients, check_answered, latency


class _Wsgi:
    """A WSGI ``app`` as serving's ``ServingApp`` takes its REST endpoints (``respond``)."""

    class _Plane:
        stopping = False

    def __init__(self, app):
        self.app, self.plane, self.metrics = app, self._Plane(), ServingMetrics()

    def respond(self, method, path, headers, body):
        import io

        out = {}
        data = b"".join(self.app({"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(body)},
                                 lambda status, hs: out.update(status=int(status[:3]), headers=hs)))
        return out["status"], data, [h for h in out["headers"] if h[0].lower() != "content-length"]


class _Serving(ServingThread):
    """serving's uvicorn worker around a WSGI ``app``, ``WebServer``'s arguments."""

    def __init__(self, app, threads: int = 1, limits: ServerLimits = ServerLimits(), on_reject=None):
        rest = _Wsgi(app)
        if on_reject is not None:
            rest.metrics.error = lambda status: on_reject() if status == 503 else None
        # the work here is held on purpose, so it runs on the threads as WebServer's does
        # (serving's inline path for small requests: tests/serving/test_http.py)
        super().__init__(ServingApp(rest, limits, threads=threads, inline=Inline(max_bytes=0)), limits)


def _queued(server) -> int:
    """Work requests waiting for a work thread."""
    return server.app.queued() if isinstance(server, ServingThread) else server.queued()


#: the servers with a work queue limit
SERVERS = {"webserver": WebServer, "serving": _Serving}


def _apps(tmp_path):
    from runtime.cube.agent import Agent, create_app as agent_app
    from runtime.cube.transfer.app import create_app as transfer_app
    from runtime.fileserver.app import create_app as fileserver_app

    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "donefile").write_text("1\n")
    return {"fileserver": (fileserver_app(tmp_path / "files"), "/donefile"),
            "agent": (agent_app(Agent("http://127.0.0.1:9", tmp_path / "agent")), "/status"),
            "transfer": (transfer_app(object()), "/healthz")}


@pytest.mark.parametrize("role", ["fileserver", "agent", "transfer"])
def test_webserver_roles_answer_with_64_slow_clients(tmp_path, role):
    app, route = _apps(tmp_path)[role]
    with WebServer(app, threads=4, name=role) as w:
        u = w.url
        out = check_answered({"healthz": lambda: latency(u + "/healthz"), "readyz": lambda: latency(u + "/readyz"),
                              route: lambda: latency(u + route)}, u)
    print(role, out)


def test_cube_server_control_answers_with_64_slow_clients():
    from tests.helpers import http, start_server

    s = start_server()
    try:
        u = http(s)
        out = check_answered({"healthz": lambda: latency(u + "/healthz"), "readyz": lambda: latency(u + "/readyz"),
                              "status": lambda: latency(u + "/status")}, u)
    finally:
        s.stop()
    print("cube server control", out)


def test_fileserver_process_answers_with_64_slow_clients(tmp_path):
    from tests.lifecycle import support

    root = tmp_path / "root"
    root.mkdir()
    (root / "donefile").write_text("1\n")
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        role = support.start(group, "fileserver", ["fileserver", "--root", str(root), "--host", "127.0.0.1",
                                                   "--port", "0"])
        u = f"http://127.0.0.1:{group.bound_ports(role)['http']}"
        support.wait_ready(role, u + "/readyz", timeout_s=60)
        out = check_answered({"healthz": lambda: latency(u + "/healthz"), "readyz": lambda: latency(u + "/readyz"),
                              "donefile": lambda: latency(u + "/donefile")}, u)
    print("fileserver process", out)


@pytest.mark.parametrize("kind", SERVERS)
def test_incomplete_headers_are_closed_after_the_header_timeout(kind):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    with SERVERS[kind](app, threads=1, limits=ServerLimits(header_timeout_s=1.0)) as w:
        with SlowClients(w.url, n=4, interval_s=0.2, max_s=10) as slow:
            deadline = time.monotonic() + 5
            while slow.closed_by_server < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert slow.closed_by_server == 4, f"{slow.closed_by_server} of 4 closed after the header timeout"
        if kind == "webserver":
            assert w.header_timeouts == 4
        assert requests.get(w.url + "/x", timeout=5).text == "ok"


@pytest.mark.parametrize("kind", SERVERS)
def test_beyond_the_queue_limit_work_is_answered_503_at_once_and_probes_answer(kind):
    release, entered = threading.Event(), threading.Event()

    def app(environ, start_response):
        if environ["REQUEST_METHOD"] == "POST":  # the work (serving answers a GET on its event loop)
            entered.set()
            release.wait(20)  # the work is stuck until the test releases it
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    rejected = []
    with SERVERS[kind](app, threads=1, limits=ServerLimits(max_queue=2), on_reject=lambda: rejected.append(1)) as w:
        results: list = []

        def call():
            try:
                r = requests.post(w.url + "/work", data=b"x", timeout=30)
                results.append((r.status_code, r.headers.get("Retry-After"), r.content))
            except requests.RequestException as exc:
                results.append(exc)

        first = [threading.Thread(target=call) for _ in range(3)]  # one running, two waiting
        first[0].start()
        assert entered.wait(5)
        for t in first[1:]:
            t.start()
        deadline = time.monotonic() + 5
        while _queued(w) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _queued(w) == 2
        t0 = time.perf_counter()
        r = requests.post(w.url + "/work", data=b"x", timeout=5)
        took = time.perf_counter() - t0
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", (r.status_code, r.headers)
        assert "queue limit 2" in json.loads(r.content)["error"]
        assert took < 1.0 and rejected == [1]
        assert requests.get(w.url + "/healthz", timeout=2).status_code == 200  # probes: not on the work thread
        assert requests.get(w.url + "/readyz", timeout=2).status_code == 200
        release.set()
        for t in first:
            t.join(30)
    assert sorted(x[0] for x in results) == [200, 200, 200], results


@pytest.mark.parametrize("kind", SERVERS)
def test_bad_pool_settings_are_refused_by_name(kind):
    with pytest.raises(ValueError, match="threads"):
        SERVERS[kind](lambda e, s: [], threads=0)


@pytest.mark.parametrize("field, value", [("max_queue", -1), ("idle_timeout_s", 0), ("header_timeout_s", float("nan")),
                                          ("max_body_bytes", -5), ("connection_limit", "many")])
def test_bad_limits_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})


@pytest.mark.parametrize("kind", SERVERS)
def test_a_head_above_the_limit_is_refused_431_whole_or_still_arriving(kind):
    import socket

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    limits = ServerLimits(max_head_bytes=4096)
    with SERVERS[kind](app, threads=1, limits=limits) as w:
        for head in (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 8192 + b"\r\n\r\n",  # whole
                     b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 8192):  # still arriving
            with socket.create_connection(("127.0.0.1", w.port), timeout=5) as s:
                s.sendall(head)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert requests.get(w.url + "/x", headers={"X-Fine": "v" * 1000}, timeout=5).text == "ok"
