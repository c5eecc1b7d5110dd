"""The HTTP roles' server: health and readiness, a graceful stop that lets requests in
flight finish, and a role process that exits 0 on SIGTERM."""
from __future__ import annotations

import http.client
import threading
import time

import pytest
import requests

from runtime.web.wsgi import WebServer, json_errors


def _app(environ, start_response):
    if environ["PATH_INFO"] == "/slow":
        time.sleep(1.0)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def test_health_readiness_and_routes():
    with WebServer(_app, name="t") as w:
        assert requests.get(w.url + "/healthz").json() == {"status": "ok"}
        assert requests.get(w.url + "/readyz").status_code == 200
        assert requests.get(w.url + "/anything").text == "ok"
        w.ready, w.reason = False, "terminating"
        r = requests.get(w.url + "/readyz")
        assert r.status_code == 503 and r.json() == {"ready": False, "reason": "terminating"}
        assert requests.get(w.url + "/healthz").status_code == 200  # still live


def test_stop_lets_requests_in_flight_finish():
    w = WebServer(_app, threads=4).start()
    out: dict[int, object] = {}

    def call(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", w.port, timeout=10)
        try:
            c.request("GET", "/slow")
            r = c.getresponse()
            out[i] = (r.status, r.read())
        except OSError as exc:
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # all three are being answered
    w.stop()
    for t in threads:
        t.join()
    assert out == {i: (200, b"ok") for i in range(3)}
    with pytest.raises(requests.ConnectionError):
        requests.get(w.url + "/healthz", timeout=2)  # no new connections after the stop


def test_json_errors_for_http_errors():
    from flask import Flask, abort

    app = json_errors(Flask("t"))

    @app.get("/gone")
    def gone():
        abort(410, "version 3 was removed")

    c = app.test_client()
    r = c.get("/nope")
    assert r.status_code == 404 and r.json == {"error": "GET /nope: not found"}
    r = c.post("/gone")
    assert r.status_code == 405 and r.json == {"error": "POST /gone: method not allowed"}
    assert "GET" in r.headers["Allow"]
    r = c.get("/gone")
    assert r.status_code == 410 and r.json == {"error": "GET /gone: version 3 was removed"}


def _control_apps(tmp_path):
    """Every Flask control app served by ``WebServer``: (name, app, a route and a method it
    does not allow)."""
    from runtime.cube.agent import Agent, create_app as agent_app
    from runtime.cube.transfer.app import create_app as transfer_app
    from runtime.fileserver.app import create_app as fileserver_app

    yield "agent", agent_app(Agent("http://127.0.0.1:9", tmp_path / "agent")), "/status", "DELETE"
    yield "transfer", transfer_app(object()), "/dict/info", "DELETE"
    yield "fileserver", fileserver_app(tmp_path), "/x", "PATCH"  # DELETE removes a file (retention)


def test_control_apps_answer_404_and_405_in_json(tmp_path):
    for name, app, path, method in _control_apps(tmp_path):
        c = app.test_client()
        r = c.get("/no/such/route/")
        assert r.status_code == 404 and r.is_json and "error" in r.json, name
        r = c.open(path, method=method)
        assert r.status_code == 405 and r.json == {"error": f"{method} {path}: method not allowed"}, name


def test_cube_server_control_answers_404_and_405_in_json():
    from tests.helpers import http, start_server

    s = start_server()
    try:
        r = requests.get(http(s) + "/nope", timeout=5)
        assert r.status_code == 404 and r.json() == {"error": "GET /nope: not found"}
        r = requests.delete(http(s) + "/status", timeout=5)
        assert r.status_code == 405 and r.json() == {"error": "DELETE /status: method not allowed"}
    finally:
        s.stop()


def test_every_graceful_role_takes_drain_seconds():
    from runtime.cli import build_parser

    parser = build_parser()
    for argv in (["fileserver", "--root", "r"], ["cube", "server", "--shard", "0"],
                 ["cube", "agent", "--work-dir", "w"], ["cube", "transfer", "--topology", "t", "--root", "r",
                                                          "--work-dir", "w"]):
        assert parser.parse_args(argv).prestop_seconds == 0.0
        assert parser.parse_args(argv + ["--prestop-seconds", "1.5"]).prestop_seconds == 1.5
