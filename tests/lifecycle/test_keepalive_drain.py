"""A stopping ``WebServer`` lets go of keep-alive clients that keep sending: each answer
given while stopping says ``Connection: close`` and the connection is closed after it, so
a client learns from the answer itself not to send on that connection again (before, an
answer kept the connection open and the client's next request could meet the drain
closing it, unanswered) and the stop ends soon after the last request in flight, well
before ``grace_period_s``.

Clients: ``CLIENTS`` threads, each a ``requests.Session`` POSTing continuously until a
connection is refused (the listening socket closed). Every request gets its answer 200
or fails to connect; a request may be lost only when sent on a connection the server
closed while it was idle (at most once per client, the client's own retry case).
"""
from __future__ import annotations

import threading
import time

import requests

from runtime.web.limits import ServerLimits
from runtime.web.wsgi import WebServer

CLIENTS = 8
GRACE_S = 20.0        # the server's grace_period_s (serving's --grace-period-seconds default)
DRAIN_BOUND_S = 8.0   # generous: the requests in flight take ~20 ms each
WORK_S = 0.02


def _app(environ, start_response):
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    time.sleep(WORK_S)
    body = b'{"ok": true}'
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class _Client(threading.Thread):
    """POSTs to ``path`` over one ``requests.Session`` until refused (or ``stop_by``, monotonic s).
    ``ok``: answers 200; ``bad``: other statuses; ``lost``: errors other than a refused
    connection; ``closes``: answers saying ``Connection: close``."""

    def __init__(self, url: str, stop_by: float, path: str = "/work"):
        super().__init__(daemon=True)
        self.url, self.stop_by, self.path = url, stop_by, path
        self.ok = self.closes = 0
        self.bad: list[int] = []
        self.lost: list[str] = []
        self.refused = False

    def run(self) -> None:
        with requests.Session() as s:
            while time.monotonic() < self.stop_by:
                try:
                    r = s.post(self.url + self.path, data=b"x" * 100, timeout=10)
                except requests.ConnectionError as exc:
                    if "refused" in str(exc).lower():
                        self.refused = True
                        return
                    self.lost.append(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code == 200:
                    self.ok += 1
                    self.closes += r.headers.get("Connection", "").lower() == "close"
                else:
                    self.bad.append(r.status_code)


def test_stop_lets_go_of_keepalive_clients_that_keep_sending():
    server = WebServer(_app, threads=4, name="keepalive", limits=ServerLimits(grace_period_s=GRACE_S),
                       probes=True).start()
    clients = [_Client(server.url, time.monotonic() + GRACE_S + 15) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    time.sleep(1.0)
    assert all(c.ok > 0 for c in clients), "every client is answered before the stop"
    before = sum(c.ok for c in clients)
    t0 = time.monotonic()
    server.stop()
    took = time.monotonic() - t0
    for c in clients:
        c.join(GRACE_S + 20)
    summary = {"stop_s": round(took, 2), "ok_before": before, "ok": sum(c.ok for c in clients),
               "closes": sum(c.closes for c in clients), "lost": sum(len(c.lost) for c in clients),
               "bad": [b for c in clients for b in c.bad]}
    print("keep-alive drain:", summary)
    assert took < DRAIN_BOUND_S, f"stop took {took:.1f} s with {CLIENTS} keep-alive clients sending: {summary}"
    assert all(c.refused for c in clients), f"every client ends refused (listening socket closed): {summary}"
    assert not summary["bad"], summary
    assert summary["closes"] >= 1, f"answers while stopping say Connection: close: {summary}"
    assert all(len(c.lost) <= 1 for c in clients), [c.lost for c in clients]
