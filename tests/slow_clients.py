"""Slow clients, as a slowloris attack or a bad network makes them: connections that send
a request's headers one line per ``interval_s`` and never finish them. Loopback only,
bounded in count (``n``) and time (``max_s``); every socket is closed on exit.

``latency(url)`` times one GET (or POST with ``json``), ``inf`` when it fails or takes
longer than ``timeout_s``; ``check_answered`` compares the same requests without and with
slow clients open.
"""
from __future__ import annotations

import math
import socket
import threading
import time
from urllib.parse import urlsplit

import requests

#: a request answered with slow clients open must take less than this (s) or than
#: ``FACTOR`` times its time without them, whichever is larger: generous, not a timing test
BOUND_S = 1.0
FACTOR = 20.0


class SlowClients:
    """``n`` connections to ``url``'s host and port (context manager), each having sent
    ``GET path HTTP/1.1`` and then one more header line every ``interval_s`` s, for at most
    ``max_s`` s. ``ready()``: seconds since every connection was open; ``closed_by_server``:
    connections the server closed (a header timeout)."""

    def __init__(self, url: str, n: int = 64, interval_s: float = 1.0, max_s: float = 60.0, path: str = "/"):
        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port
        assert self.host.startswith("127."), "slow clients are for loopback only"
        self.n, self.interval_s, self.max_s, self.path = n, interval_s, max_s, path
        self.socks: list[socket.socket] = []
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, name="slow-clients", daemon=True)
        self.opened_at = 0.0

    def __enter__(self) -> "SlowClients":
        try:
            for _ in range(self.n):
                s = socket.create_connection((self.host, self.port), timeout=5)
                s.sendall(f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n".encode())
                self.socks.append(s)
        except BaseException:
            self.close()
            raise
        self.opened_at = time.monotonic()
        self._thread.start()
        return self

    def _drip(self) -> None:
        i = 0
        t0 = time.monotonic()
        alive = list(self.socks)
        while not self._stop.wait(self.interval_s) and time.monotonic() - t0 < self.max_s:
            i += 1
            still = []
            for s in alive:
                try:
                    s.sendall(f"X-Slow-{i}: {i}\r\n".encode())
                    still.append(s)
                except OSError:
                    self.closed_by_server += 1
            alive = still

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self.close()


def latency(url: str, timeout_s: float = 5.0, **post) -> float:
    """Seconds to a 2xx answer of GET ``url`` (POST with ``post`` kwargs for
    ``requests.post``); ``inf`` on an error status, an error or a timeout."""
    t0 = time.perf_counter()
    try:
        r = requests.post(url, timeout=timeout_s, **post) if post else requests.get(url, timeout=timeout_s)
    except requests.RequestException:
        return math.inf
    return time.perf_counter() - t0 if r.ok else math.inf


def check_answered(calls: dict, url: str, n: int = 64, settle_s: float = 2.5, timeout_s: float = 5.0) -> dict:
    """Times each of ``calls`` (name -> zero-argument callable returning seconds) without
    slow clients, then with ``n`` slow clients to ``url`` open for ``settle_s`` s (each has
    sent a few header lines, so a server that gives them threads has none left); asserts
    every call answered within ``max(BOUND_S, FACTOR x its time without)``. Returns
    ``{name: (without, with)}``."""
    before = {name: min(f() for _ in range(3)) for name, f in calls.items()}
    assert all(math.isfinite(v) for v in before.values()), f"not answered even without slow clients: {before}"
    with SlowClients(url, n=n) as slow:
        time.sleep(settle_s)
        after = {name: f() for name, f in calls.items()}
        closed = slow.closed_by_server
    out = {name: (round(before[name], 4), round(after[name], 4)) for name in calls}
    bad = {name: v for name, v in out.items() if not v[1] < max(BOUND_S, FACTOR * v[0])}
    assert not bad, f"with {n} slow clients open, not answered in time (without, with) s: {bad}; all: {out}; " \
                    f"slow connections closed by the server meanwhile: {closed}"
    return out
