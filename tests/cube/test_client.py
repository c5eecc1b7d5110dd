"""Cube client: sharding, replica failover, timeout, backup request, version pinning, threads."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from runtime.cube import kernel, protocol
from runtime.cube.client import CubeClient, CubeUnavailable, CubeVersionUnavailable
from runtime.cube.client.calls import Outcome, scatter
from runtime.formats.topology import Topology, shard_of, shard_rows
from tests.helpers import build_version, load_and_enable, make_data, shard_dir, start_server


class BlackHole:
    """Accepts connections and never answers (a hung replica)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            self.accepted(c)

    def accepted(self, c):
        """A new connection: kept open, never answered."""

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def cluster(tmp_path):
    """2 shards x 2 replicas serving version 100; yields (servers[shard][replica], keys, values, tmp)."""
    keys, values = make_data(4000, 3, seed=11)
    base = build_version(tmp_path, keys, values, version=100, shard_num=2)
    servers = [[start_server(s, 2) for _ in range(2)] for s in range(2)]
    for s in range(2):
        for srv in servers[s]:
            load_and_enable(srv, shard_dir(base, s), 100)
    yield servers, keys, values, tmp_path
    for reps in servers:
        for srv in reps:
            srv.stop()


def _topology(servers) -> Topology:
    """The topology of in-thread servers (no agents run here: their URLs are never called)."""
    return Topology.build("emb", [[(f"127.0.0.1:{r.port}", f"http://127.0.0.1:{r.http_port}", "http://127.0.0.1:9")
                                   for r in reps] for reps in servers])


def test_seek_splits_by_shard(cluster, tmp_path):
    servers, keys, values, _ = cluster
    path = _topology(servers).write(tmp_path / "topology.json")
    with CubeClient.from_topology(str(path), timeout_ms=2000) as c:
        assert c.dim == 3
        q = np.concatenate([keys[:1000], keys[:7] ^ np.uint64(1 << 63)])
        res = c.seek(q)
        assert res.version == 100 and res.values.shape == (1007, 3)
        assert res.found[:1000].all() and not res.found[1000:].any()
        np.testing.assert_array_equal(res.values[:1000], values[:1000])
        assert (res.values[1000:] == 0).all()
        empty = c.seek(np.empty(0, np.uint64))
        assert empty.values.shape == (0, 3)
        # only shard-1 keys
        odd = keys[shard_of(keys, 2) == 1][:10]
        np.testing.assert_array_equal(c.seek(odd).values, values[shard_of(keys, 2) == 1][:10])
    # both replicas of each shard got requests (round robin)
    with CubeClient.from_topology(_topology(servers)) as c:
        for _ in range(8):
            c.seek(keys[:100])
    assert all(r.counters()["requests"] > 0 for reps in servers for r in reps)


def test_replica_failover_and_unavailable(cluster):
    servers, keys, values, _ = cluster
    c = CubeClient.from_topology(_topology(servers), timeout_ms=2000, retries=2)
    c.seek(keys[:10])  # pooled connections now exist to some replicas
    servers[0][0].stop()
    for _ in range(6):
        res = c.seek(keys[:500])
        np.testing.assert_array_equal(res.values, values[:500])
    servers[0][1].stop()
    with pytest.raises(CubeUnavailable, match="shard 0"):
        c.seek(keys[:500])
    c.close()


def test_timeout_retry_and_backup_request(cluster):
    servers, keys, values, _ = cluster
    hole = BlackHole()
    try:
        good = f"127.0.0.1:{servers[0][0].port}"
        black = f"127.0.0.1:{hole.port}"
        # only a hung replica: CubeUnavailable after about (retries + 1) x timeout
        c = CubeClient([[black]], timeout_ms=100, retries=1)
        t0 = time.monotonic()
        with pytest.raises(CubeUnavailable):
            c.seek(keys[:10])
        assert time.monotonic() - t0 < 1.5
        # hung + good replica: the timeout moves the request to the good one
        even = keys[shard_of(keys, 2) == 0][:50]
        c = CubeClient([[black, good]], timeout_ms=200, retries=1)
        for _ in range(3):
            assert c.seek(even).found.all()
        # a backup request answers well before the timeout
        c = CubeClient([[black, good]], timeout_ms=5000, retries=0, backup_request_ms=20, down_s=0)
        for _ in range(4):
            t0 = time.monotonic()
            assert c.seek(even).found.all()
            assert time.monotonic() - t0 < 2.0
    finally:
        hole.close()


def test_version_pinning_during_a_switch(cluster):
    servers, keys, values, tmp = cluster
    newer = build_version(tmp, keys, values + 10, version=101, shard_num=2)
    c = CubeClient.from_topology(_topology(servers), timeout_ms=2000)
    # shard 0 (both replicas) switches to 101, shard 1 still serves 100
    for srv in servers[0]:
        load_and_enable(srv, shard_dir(newer, 0), 101)
    for _ in range(4):
        res = c.seek(keys[:400])
        assert res.version == 100  # the newest version every shard holds
        np.testing.assert_array_equal(res.values, values[:400])
    # one replica of shard 1 switched, the other not: still whole-version batches
    load_and_enable(servers[1][0], shard_dir(newer, 1), 101)
    for _ in range(6):
        res = c.seek(keys[:400])
        expect = values[:400] + (10 if res.version == 101 else 0)
        np.testing.assert_array_equal(res.values, expect)
    load_and_enable(servers[1][1], shard_dir(newer, 1), 101)
    res = c.seek(keys[:400])
    assert res.version == 101
    np.testing.assert_array_equal(res.values, values[:400] + 10)
    # asking for the previous version explicitly still works on every shard
    res = c.seek(keys[:400], version=100)
    assert res.version == 100
    np.testing.assert_array_equal(res.values, values[:400])
    fallbacks = c.native_fallbacks
    with pytest.raises(CubeVersionUnavailable, match="99"):  # refused in C, explained in Python
        c.seek(keys[:10], version=99)
    assert c.native_fallbacks == fallbacks + 1
    c.close()


def test_thread_safe(cluster):
    servers, keys, values, _ = cluster
    c = CubeClient.from_topology(_topology(servers), timeout_ms=5000)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(40):
                i = rng.integers(0, len(keys), 200)
                res = c.seek(keys[i])
                if not res.found.all() or not np.array_equal(res.values, values[i]):
                    errors.append("wrong values")
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    c.close()


class Garbage(BlackHole):
    """Answers every request with a frame of the right length prefix and a wrong magic."""

    def accepted(self, c):
        threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    @staticmethod
    def _answer(c):
        try:
            while c.recv(65536):
                c.sendall(b"\x24\x00\x00\x00" + b"\x00" * 36)
        except OSError:
            pass


class Replier(BlackHole):
    """Answers each request (read whole: its length prefix) with ``reply(count)`` bytes;
    closes the connection after a reply that ends with ``CLOSE``."""

    CLOSE = b"<close>"

    def __init__(self, reply):
        self.reply = reply
        super().__init__()

    def accepted(self, c):
        threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    def _answer(self, c):
        buf = b""
        try:
            while True:
                while len(buf) < 4 or len(buf) < 4 + protocol.LEN.unpack_from(buf)[0]:
                    got = c.recv(65536)
                    if not got:
                        return
                    buf += got
                size = 4 + protocol.LEN.unpack_from(buf)[0]
                count = protocol.REQ_HEADER.unpack_from(buf, 4)[5]
                buf = buf[size:]
                out = self.reply(count)
                c.sendall(out.removesuffix(self.CLOSE))
                if out.endswith(self.CLOSE):
                    c.close()
                    return
        except OSError:
            pass


def _ok_header(count: int, dim: int, length: int | None = None) -> bytes:
    size = protocol.reply_size(count, dim)
    return protocol.LEN.pack((size if length is None else length) - 4) + protocol.REP_HEADER.pack(
        protocol.MAGIC, protocol.OK, 0, 0, 0, count, dim, 100, 0)


BAD_REPLIES = {  # name: (reply(count), the C path's outcome for the shard)
    "wrong magic": (lambda n: b"\x24\x00\x00\x00" + b"\x00" * 36, kernel.SEEK_MALFORMED),
    "count disagrees": (lambda n: _ok_header(n - 1, 3) + bytes(protocol.reply_size(n - 1, 3) - 40),
                        kernel.SEEK_MALFORMED),
    "dim disagrees": (lambda n: _ok_header(n, 4) + bytes(protocol.reply_size(n, 4) - 40), kernel.SEEK_MALFORMED),
    "length beyond the reply": (lambda n: _ok_header(n, 3, 1 << 20) + Replier.CLOSE, kernel.SEEK_MALFORMED),
    "closed mid-reply": (lambda n: _ok_header(n, 3)[:30] + Replier.CLOSE, kernel.SEEK_IO),
    "no answer": (lambda n: Replier.CLOSE, kernel.SEEK_IO),
    "server error": (lambda n: protocol.encode_error(protocol.SERVER_ERROR, 0, 100, 0, "boom"), protocol.SERVER_ERROR),
    "server error, longest message": (lambda n: protocol.encode_error(
        protocol.SERVER_ERROR, 0, 100, 0, "x" * (protocol.MAX_ERROR_MESSAGE + 1)), protocol.SERVER_ERROR),
    "version unavailable": (lambda n: protocol.encode_error(protocol.VERSION_UNAVAILABLE, 0, 100, 99, "no"),
                            protocol.VERSION_UNAVAILABLE),
}


@pytest.mark.parametrize("bad", list(BAD_REPLIES))
def test_native_path_names_each_bad_reply_and_the_client_still_answers(cluster, bad):
    servers, keys, values, _ = cluster
    reply, outcome = BAD_REPLIES[bad]
    fake = Replier(reply)
    try:
        sock = socket.create_connection(("127.0.0.1", fake.port))
        sock.setblocking(False)
        q = keys[:20]
        fds, meta = np.array([sock.fileno()], np.int32), np.zeros(3, np.int64)
        vals, found = np.empty((20, 3), np.float32), np.empty(20, bool)
        rc = kernel.KERNEL.client_seek_raw(q.ctypes.data, 20, 1, fds.ctypes.data, 3, 0, 300_000,
                                           vals.ctypes.data, found.ctypes.data, meta.ctypes.data)
        sock.close()
        assert (rc, int(meta[0])) == (1, outcome)
        if outcome == protocol.VERSION_UNAVAILABLE:
            assert meta[1:].tolist() == [100, 99]  # what the replica holds, for the pinning
        # through the client: a bad replica beside a good one of shard 1, right answers
        c = CubeClient([[f"127.0.0.1:{servers[0][0].port}"],
                        [f"127.0.0.1:{fake.port}", f"127.0.0.1:{servers[1][0].port}"]],
                       timeout_ms=300, retries=2, down_s=30)
        c.seek(keys[shard_of(keys, 2) == 0][:1])  # learns dim
        for _ in range(3):
            np.testing.assert_array_equal(c.seek(keys[:200]).values, values[:200])
        # a replica holding other versions is not marked down (the Python path pins a
        # version): each batch that meets it (round robin: every one here) is handed over;
        # every other bad one is marked down by the first
        assert c.native_fallbacks == (3 if outcome == protocol.VERSION_UNAVAILABLE else 1)
        c.close()
    finally:
        fake.close()


@pytest.fixture
def counted_native(monkeypatch):
    """Counts the calls of the C request path (``kernel.c``'s ``cube_client_seek``)."""
    calls = []
    raw = kernel.KERNEL.client_seek_raw

    def counting(*args):
        calls.append(args[2])
        return raw(*args)
    monkeypatch.setattr(kernel.KERNEL, "client_seek_raw", counting)
    return calls


@pytest.mark.parametrize("shard_num", [3, 4])
def test_native_path_answers_as_the_python_path(tmp_path, counted_native, shard_num):
    keys, values = make_data(3000, 5, seed=shard_num)
    base = build_version(tmp_path, keys, values, version=7, shard_num=shard_num)
    servers = [[start_server(s, shard_num)] for s in range(shard_num)]
    try:
        for s in range(shard_num):
            load_and_enable(servers[s][0], shard_dir(base, s), 7)
        native = CubeClient.from_topology(_topology(servers), timeout_ms=2000)
        python = CubeClient.from_topology(_topology(servers), timeout_ms=2000, native=False)
        rng = np.random.default_rng(1)
        for n in (1, 2, 26, 700):  # some batches leave shards without keys
            q = keys[rng.integers(0, len(keys), n)]
            q[rng.random(n) < 0.3] ^= np.uint64(1 << 62)  # misses
            a, b = native.seek(q), python.seek(q)
            assert a.version == b.version == 7
            np.testing.assert_array_equal(a.found, b.found)
            np.testing.assert_array_equal(a.values, b.values)
            hit = np.isin(q, keys)
            np.testing.assert_array_equal(a.found, hit)
            assert (a.values[~hit] == 0).all()
            assert native.seek(q, version=7).version == 7
        # the first seek learned dim through the Python path; every later one ran in C
        assert len(counted_native) == 7 and native.native_fallbacks == 0
        assert counted_native[0] == shard_num
        native.close()
        python.close()
    finally:
        for reps in servers:
            reps[0].stop()


def test_native_path_hands_what_is_not_plain_to_the_python_path(cluster, counted_native):
    servers, keys, values, _ = cluster
    hole, garbage = BlackHole(), Garbage()
    try:
        good0, good1 = (f"127.0.0.1:{servers[s][0].port}" for s in range(2))
        c = CubeClient([[good0], [f"127.0.0.1:{hole.port}", f"127.0.0.1:{garbage.port}", good1]],
                       timeout_ms=300, retries=2, down_s=30)
        c.seek(keys[shard_of(keys, 2) == 0][:1])  # learns dim (Python path, shard 0 only)
        for _ in range(3):  # a hung, a garbling and a good replica of shard 1: right answers
            res = c.seek(keys[:200])
            np.testing.assert_array_equal(res.values, values[:200])
        assert c.native_fallbacks == 1 and len(counted_native) == 3  # the first met the hung one
        down = [r.addr for r in c.shards[1] if r.down_until > time.monotonic()]
        assert down == [f"127.0.0.1:{hole.port}", f"127.0.0.1:{garbage.port}"]
        fallbacks = c.native_fallbacks
        for _ in range(3):  # both marked down: the C path goes to the good one
            np.testing.assert_array_equal(c.seek(keys[:200]).values, values[:200])
        assert c.native_fallbacks == fallbacks
        c.close()
    finally:
        hole.close()
        garbage.close()


def test_scatter_puts_replies_back_in_batch_order_and_refuses_a_misfit():
    keys = np.random.default_rng(5).integers(0, 2**64, size=301, dtype=np.uint64)
    dim = 4
    expect = np.random.default_rng(6).random((301, dim), dtype=np.float32)
    hit = np.random.default_rng(7).random(301) > 0.2
    expect[~hit] = 0.0
    idx = dict(enumerate(shard_rows(keys, 3)))
    out = {s: Outcome(True, 1, None, hit[i], expect[i]) for s, i in idx.items()}
    values, found = scatter(301, dim, idx, out)
    np.testing.assert_array_equal(values, expect)
    np.testing.assert_array_equal(found, hit)
    out[1] = Outcome(True, 1, None, hit[idx[1]][:-1], expect[idx[1]][:-1])
    with pytest.raises(ValueError, match="cube shard 1"):
        scatter(301, dim, idx, out)
