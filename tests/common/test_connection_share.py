"""Processes serving one listening socket spread their connections
(``runtime.serving.http_server.HttpServer``'s ``share``,
``runtime.serving.worker.ConnectionShare``): a process holding more than another leaves a
pending connection to it, and takes it itself when the others do not within
``ACCEPT_ESCAPE_S``."""
from __future__ import annotations

import http.client
import socket
import time

import pytest

from runtime.serving import http_server
from runtime.serving.http_server import HttpServer
from runtime.serving.worker import ConnectionShare


def _named_app(name: str):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(name)))])
        return [name.encode()]
    return app


@pytest.fixture
def listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    s.setblocking(False)
    yield s
    s.close()


def _connect(port: int) -> tuple[http.client.HTTPConnection, str]:
    """A keep-alive connection and the name of the server that answered its first request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    assert r.status == 200
    return c, r.read().decode()


def test_share_assigns_free_slots_and_counts_live_ones():
    share = ConnectionShare(3)
    assert share.assign(set()) == 0 and share.assign({0}) == 1 and share.assign({0, 2}) == 1
    with pytest.raises(RuntimeError, match="all 3 slots"):
        share.assign({0, 1, 2})
    a, b, c = share.bind(0), share.bind(1), share.bind(2)
    assert a.least(5)  # nobody else has published: alone
    b.publish(2)
    assert a.least(2) and not a.least(3)
    c.publish(1)
    assert not a.least(2) and a.least(1)
    c.leave()  # stopping: no longer counted
    assert a.least(2)
    share.beats[1] = time.monotonic() - ConnectionShare.STALE_S - 1  # b stopped publishing (gone, hung)
    assert a.least(100)
    with pytest.raises(ValueError, match="slots"):
        ConnectionShare(0)


def test_two_servers_over_one_socket_split_keepalive_connections(listener):
    share = ConnectionShare(4)
    servers = [HttpServer(_named_app(n), sockets=[listener.dup()], threads=2, share=share.bind(i),
                          name=n).start() for i, n in enumerate("ab")]
    conns = []
    try:
        deadline = time.monotonic() + 5  # each counts the other once it has published (its loop runs)
        while not (share.beats[:2] > 0).all() and time.monotonic() < deadline:
            time.sleep(0.01)
        for k in range(8):
            c, who = _connect(servers[0].port)
            conns.append((c, who))
            names = [w for _, w in conns]
            # each new connection goes to the server holding fewer: never more than one apart
            assert abs(names.count("a") - names.count("b")) <= 1, names
        assert sorted(names) == ["a"] * 4 + ["b"] * 4
        for c, who in conns:  # the connections stay where they were accepted
            c.request("GET", "/")
            assert c.getresponse().read().decode() == who
        # No count of deferrals is asserted here: both loops are woken for each pending
        # connection, and when the one holding fewer accepts before the other looks, nothing
        # was deferred (a race, seen in CI). The deferral itself is tested on its own below;
        # the split above is what can fail: with the share's ``least`` always true it failed
        # in 6 runs of 6 (one loop takes most connections).
    finally:
        for c, _ in conns:
            c.close()
        for s in servers:
            s.stop()


def test_a_pending_connection_is_taken_after_the_escape_when_the_others_do_not(listener):
    share = ConnectionShare(2)
    other = share.bind(1)
    other.publish(0)  # a live process holding nothing that never accepts (busy)
    w = HttpServer(_named_app("a"), sockets=[listener], threads=2, share=share.bind(0), name="a")
    w.start()
    try:
        first, _ = _connect(w.port)  # 0 <= 0: taken at once
        other.publish(0)
        t0 = time.monotonic()
        second, who = _connect(w.port)  # 1 > 0: left to the other, then taken after the escape
        waited = time.monotonic() - t0
        assert who == "a" and (w.deferred, w.escaped) == (1, 1)
        assert http_server.ACCEPT_ESCAPE_S * 0.8 <= waited < 2.0, waited
        assert share.conns[0] == 2  # published as soon as it was accepted
        first.close()
        second.close()
    finally:
        w.stop()
    assert share.beats[0] == 0.0  # stopping left the share: the others no longer wait for it


def test_a_pause_ends_even_when_its_timer_fires_before_the_clock_says_so(listener):
    """The loop's timers may fire before ``time.monotonic()`` reaches the pause's end (uvloop
    keeps a millisecond clock): the pause ends anyway, and a new connection is answered."""
    w = HttpServer(_named_app("a"), sockets=[listener], threads=1, name="a")
    w.start()
    try:
        c, _ = _connect(w.port)
        c.close()

        def pause_with_a_clock_ahead():
            w._pause_accepting(0.02)
            w._defer_until += 0.05  # the timer will fire 50 ms before this
        w._loop.call_soon_threadsafe(pause_with_a_clock_ahead)
        time.sleep(0.3)  # past the timer, and past _defer_until too
        assert w._accepting
        c, who = _connect(w.port)
        assert who == "a"
        c.close()
    finally:
        w.stop()
