"""The cube roles that serve requests, stopped by SIGTERM as the kubelet stops their pods:
the cube server (batch lookups in flight on the data plane are answered: frames half sent
at the signal, and pipelined frames whose large replies the client has not read yet),
the agent and the transfer (readiness false while they still answer, during
``--prestop-seconds``). Each exits 0 within the bound, with its start line (host, port, pid)
and no traceback in its output.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import requests

from runtime import proc
from runtime.cube import protocol
from runtime.formats.topology import Topology
from tests.helpers import DICT, build_version, make_data, refusing_ports, shard_dir
from tests.lifecycle import support

KEYS = 300_000       # keys in the served version
BATCH = 250_000      # keys per lookup (2 MB request, 4 MB reply at dim 4)
SPLIT = 3            # connections whose frame is half sent at the signal
PIPELINED = 3        # frames sent back to back on one connection, replies unread at the signal
VERSION = 100


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _read_reply(sock: socket.socket) -> bytes:
    head = _recv_exactly(sock, 4)
    (length,) = protocol.LEN.unpack(head)
    return head + _recv_exactly(sock, length)


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    """A base version of ``KEYS`` keys (dim 4) built for one shard: (shard dir, keys
    uint64[KEYS] sorted, values float32[KEYS, 4] in that order)."""
    tmp = tmp_path_factory.mktemp("cube-stop")
    keys, values = make_data(KEYS, dim=4, seed=7)
    result = build_version(tmp, keys, values, version=VERSION)
    order = np.argsort(keys)
    return shard_dir(result, 0), keys[order], values[order]


def _lookups(keys: np.ndarray, values: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``BATCH`` keys to look up (about a tenth absent from the version), and what the
    server must answer: values float32[BATCH, 4] (zeros for a miss), found bool[BATCH]."""
    rng = np.random.default_rng(seed)
    ask = rng.choice(keys, BATCH, replace=True)
    miss = rng.random(BATCH) < 0.1
    ask[miss] = rng.integers(1, 2**63, int(miss.sum()), dtype=np.uint64)
    pos = np.minimum(np.searchsorted(keys, ask), len(keys) - 1)
    found = keys[pos] == ask
    want = np.where(found[:, None], values[pos], np.float32(0)).astype(np.float32)
    return ask, want, found


@pytest.mark.parametrize("io_mode", ["epoll", "threads"])
def test_cube_server_answers_lookups_in_flight_on_sigterm(tmp_path, version, io_mode):
    d, keys, values = version
    env, auth = support.credentials(tmp_path / "credentials")
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        role = support.start(group, "cube-server", [
            "cube", "server", "--shard", "0", "--shard-num", "1", "--dict-name", DICT, "--host", "127.0.0.1",
            "--port", "0", "--http-port", "0", "--io-mode", io_mode], env)
        bound = group.bound_ports(role)
        port, hport = bound["data"], bound["http"]
        url = f"http://127.0.0.1:{hport}"
        support.wait_ready(role, url + "/readyz", timeout_s=60)
        r = requests.post(url + "/bg_load_base", json={"dir": d, "version": VERSION}, timeout=5, headers=auth)
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 60
        while requests.get(url + "/status", timeout=5).json()["bg_state"] != "loaded":
            assert time.monotonic() < deadline, requests.get(url + "/status", timeout=5).json()
            time.sleep(0.05)
        assert requests.post(url + "/enable", json={"version": VERSION}, timeout=5, headers=auth).status_code == 200

        expected = [_lookups(keys, values, seed) for seed in range(SPLIT + PIPELINED)]
        frames = [protocol.encode_request(k, version=VERSION, request_id=i) for i, (k, _, _) in enumerate(expected)]
        split = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(SPLIT)]
        for s, f in zip(split, frames[:SPLIT]):
            s.sendall(f[:len(f) // 2])  # the rest after the signal: certainly in flight
        piped = socket.create_connection(("127.0.0.1", port), timeout=30)
        sender = threading.Thread(target=piped.sendall, args=(b"".join(frames[SPLIT:]),), daemon=True)
        sender.start()  # blocks while the server waits for us to read its replies
        time.sleep(0.5)

        watch = support.StopWatch(role, url + "/readyz")
        t_signal = watch.start()
        time.sleep(0.5)
        # still being answered: the server waits for the rest of the half-sent frames
        assert role.proc.poll() is None, proc.tail(role.log_path)
        for s, f in zip(split, frames[:SPLIT]):
            s.sendall(f[len(f) // 2:])
        # every connection read at once, as clients do (the server's one epoll thread waits
        # while a client does not read its replies)
        replies: dict[int, bytes | Exception] = {}

        def read(i: int, s: socket.socket, n: int = 1) -> None:
            try:
                for j in range(n):
                    replies[i + j] = _read_reply(s)
            except Exception as exc:  # noqa: BLE001 - reported below
                replies[i] = exc

        readers = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(split)]
        readers.append(threading.Thread(target=read, args=(SPLIT, piped, PIPELINED)))
        for t in readers:
            t.start()
        for t in readers:
            t.join(30)
        t_answered = time.monotonic() - t_signal
        sender.join(10)
        stop = watch.result()
        for s in split + [piped]:
            s.close()

        assert sorted(replies) == list(range(SPLIT + PIPELINED)), replies
        assert not [r for r in replies.values() if isinstance(r, Exception)], replies
        for i, (_, want, found) in enumerate(expected):
            rid, got_version, _, got_found, values = protocol.decode_reply(replies[i])
            assert (rid, got_version) == (i, VERSION)
            np.testing.assert_array_equal(got_found, found)
            np.testing.assert_array_equal(values, want)
        support.check_stop(stop, role)
        assert t_answered < stop.seconds
        support.check_log(role, "127.0.0.1", [port, hport])
    print(f"cube server ({io_mode}): answered {len(replies)} lookups of {BATCH} keys {t_answered:.2f} s after SIGTERM, "
          f"exit after {stop.seconds:.2f} s; probes {[p[1] for p in stop.probes]}")


def _drain_stop(group: proc.ProcessGroup, name: str, args: list[str], busy_path: str,
                env: dict[str, str] | None = None) -> support.Stop:
    """Starts a control role on a port it binds, with ``--prestop-seconds 1.5``, SIGTERM, and
    checks that during the drain it is not ready but still answers ``busy_path`` with 200,
    then exits 0."""
    role = support.start(group, name, args + ["--host", "127.0.0.1", "--port", "0", "--prestop-seconds", "1.5"], env)
    (port,) = group.bound_ports(role).values()
    url = f"http://127.0.0.1:{port}"
    support.wait_ready(role, url + "/readyz", timeout_s=60)
    assert requests.get(url + busy_path, timeout=5).status_code == 200
    watch = support.StopWatch(role, url + "/readyz")
    watch.start()
    time.sleep(0.5)
    during = requests.get(url + busy_path, timeout=5)
    ready = requests.get(url + "/readyz", timeout=5)
    live = requests.get(url + "/healthz", timeout=5)
    stop = watch.result()
    assert during.status_code == 200, during.text
    assert ready.status_code == 503 and ready.json()["ready"] is False, ready.text
    assert live.status_code == 200
    support.check_stop(stop, role)
    assert stop.seconds >= 1.5
    support.check_log(role, "127.0.0.1", [port])
    print(f"{name}: exit after {stop.seconds:.2f} s; probes {[p[1] for p in stop.probes]}")
    return stop


def test_cube_agent_turns_unready_then_exits_0_on_sigterm(tmp_path):
    with refusing_ports(1) as (server_http,), proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        _drain_stop(group, "cube-agent", ["cube", "agent", "--server-http", f"http://127.0.0.1:{server_http}",
                                          "--work-dir", str(tmp_path / "agent")], "/status",
                    support.credentials(tmp_path / "credentials")[0])


def test_cube_transfer_turns_unready_then_exits_0_on_sigterm(tmp_path):
    (tmp_path / "root").mkdir()
    with refusing_ports(3) as ports, proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        topo = Topology.build(DICT, [[(f"127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}",
                                       f"http://127.0.0.1:{ports[2]}")]]).write(tmp_path / "topology.json")
        _drain_stop(group, "cube-transfer", ["cube", "transfer", "--topology", str(topo), "--root",
                                             str(tmp_path / "root"), "--work-dir", str(tmp_path / "transfer"),
                                             "--poll-seconds", "0.2", "--reconcile-every-seconds", "0"],
                    "/dict/info", support.credentials(tmp_path / "credentials")[0])
