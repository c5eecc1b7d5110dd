"""Cube server: background load, atomic enable, patches in place, previous version,
HTTP control errors, malformed/oversized frames, restart from --data-dir, the CLI process."""
from __future__ import annotations

import socket
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from runtime.cube import protocol
from runtime.formats.topology import shard_of
from runtime.proc import ProcessGroup
from tests.helpers import (DICT, build_version, enable, http, load, load_and_enable,
                                          make_data, shard_dir, start_server)


class Conn:
    """A raw data-plane connection."""

    def __init__(self, server):
        self.s = socket.create_connection(("127.0.0.1", server.port), timeout=5)

    def recv_frame(self) -> bytes:
        head = self._exact(4)
        return head + self._exact(protocol.LEN.unpack(head)[0])

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def seek(self, keys, version=None, rid=1):
        self.s.sendall(protocol.encode_request(np.asarray(keys, np.uint64), version, rid))
        return protocol.decode_reply(self.recv_frame())

    def closed(self) -> bool:
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.s.close()


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.stop()


@pytest.fixture
def data(tmp_path):
    keys, values = make_data(3000, 4, seed=5)
    base = build_version(tmp_path, keys, values, version=100)
    return tmp_path, keys, values, base


@pytest.fixture(params=["epoll", "threads"])
def any_server(request):
    s = start_server(io_mode=request.param)
    yield s
    s.stop()


def test_not_ready_then_load_enable_seek(any_server, data):
    server = any_server
    tmp, keys, values, base = data
    c = Conn(server)
    with pytest.raises(protocol.ReplyError) as err:
        c.seek(keys[:3])
    assert err.value.status == protocol.NOT_READY
    st = load(server, shard_dir(base, 0), 100)
    assert st["bg_state"] == "loaded" and st["bg_version"] == 100 and st["version"] is None
    assert enable(server, 100).status_code == 200
    q = np.concatenate([keys[:500], keys[:3] ^ np.uint64(1 << 63)])
    rid, version, other, found, vals = c.seek(q, rid=42)
    assert rid == 42 and version == 100 and other == 0
    assert found[:500].all() and not found[500:].any()
    np.testing.assert_array_equal(vals[:500], values[:500])
    assert (vals[500:] == 0).all()
    # keep-alive and pipelining: two requests sent back to back on one connection
    c.s.sendall(protocol.encode_request(keys[:2], None, 7) + protocol.encode_request(keys[2:5], None, 8))
    assert protocol.decode_reply(c.recv_frame())[0] == 7
    r2 = protocol.decode_reply(c.recv_frame())
    assert r2[0] == 8 and r2[3].all() and len(r2[3]) == 3
    st = requests.get(http(server) + "/status").json()
    assert st["version"] == 100 and st["keys"] == 3000 and st["dim"] == 4 and st["requests"] >= 3
    c.close()


def test_frame_sizes_follow_the_protocol(server, data):
    """Every batch size (found mask padding 0..7 bytes): the request is ``request_size``
    bytes and the server's reply is exactly ``reply_layout``'s frame (protocol.py owns both)."""
    tmp, keys, values, base = data
    load_and_enable(server, shard_dir(base, 0), 100)
    c = Conn(server)
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 1000):
        frame = protocol.encode_request(keys[:n], 100, n)
        assert len(frame) == protocol.request_size(n)
        c.s.sendall(frame)
        reply = c.recv_frame()
        values_at, size = protocol.reply_layout(n, 4)
        assert len(reply) == size == protocol.reply_size(n, 4) and (values_at - protocol.REP_PREFIX) % 8 == 0
        assert values_at - protocol.REP_PREFIX - n < 8
        rid, version, _, found, vals = protocol.decode_reply(reply)
        assert (rid, version) == (n, 100) and found.all()
        np.testing.assert_array_equal(vals, values[:n])
    c.close()


def test_switch_keeps_previous_version_and_patch(server, data):
    tmp, keys, values, base = data
    load_and_enable(server, shard_dir(base, 0), 100)
    c = Conn(server)
    # a patch: 10 changed keys and 5 new ones
    new_keys = make_data(20, 4, seed=9)[0][:5]
    dkeys = np.concatenate([keys[:10], new_keys])
    dvals = np.full((15, 4), 3.5, np.float32)
    delta = build_version(tmp, dkeys, dvals, version=101, mode="delta", base_version=100)
    st = load(server, shard_dir(delta, 0), 101, base_version=100)
    assert st["bg_state"] == "loaded"
    # while the patch waits in the background, version 100 keeps serving
    assert c.seek(keys[:10])[1] == 100
    assert enable(server, 101).status_code == 200
    _, version, other, found, vals = c.seek(dkeys)
    assert version == 101 and other == 100 and found.all() and (vals == 3.5).all()
    # the previous version is still answered when asked for, unchanged (versioned views)
    _, version, other, found, vals = c.seek(dkeys, version=100)
    assert version == 100 and other == 101
    np.testing.assert_array_equal(vals[:10], values[:10])
    assert not found[10:].any()
    # a version the server does not hold
    with pytest.raises(protocol.ReplyError) as err:
        c.seek(keys[:3], version=55)
    assert err.value.status == protocol.VERSION_UNAVAILABLE and err.value.version == 101 and err.value.other == 100
    assert c.seek(keys[:3])[1] == 101  # the connection is still usable after that reply
    # the next load drops the previous version
    base2 = build_version(tmp, keys, values + 1, version=102)
    load(server, shard_dir(base2, 0), 102)
    with pytest.raises(protocol.ReplyError):
        c.seek(keys[:3], version=100)
    assert enable(server, 102).status_code == 200
    np.testing.assert_array_equal(c.seek(keys[:3])[4], values[:3] + 1)
    assert requests.get(http(server) + "/status").json()["lineage"] == [102]
    c.close()


def test_control_conflicts_and_failed_load(server, data):
    tmp, keys, values, base = data
    load_and_enable(server, shard_dir(base, 0), 100)
    delta = build_version(tmp, keys[:5], values[:5], version=301, mode="delta", base_version=300)
    # a patch whose base is not the served version: 409, nothing changes
    r = requests.post(http(server) + "/bg_load_patch",
                      json={"dir": shard_dir(delta, 0), "version": 301, "base_version": 300})
    assert r.status_code == 409 and "300" in r.json()["error"]
    # a patch request naming the served base, but whose dict is built on another base: fails in bg
    st = load(server, shard_dir(delta, 0), 301, base_version=100)
    assert st["bg_state"] == "failed" and "300" in st["bg_error"]
    # enabling a version not loaded: 409
    assert enable(server, 301).status_code == 409
    assert enable(server, 100).status_code == 200  # already served: idempotent
    # a truncated dict fails to load, the served version is untouched
    bad = build_version(tmp, keys, values, version=103)
    vf = tmp / "out" / DICT / "103" / f"{DICT}_part0" / "values.f32"
    vf.write_bytes(vf.read_bytes()[:100])
    st = load(server, shard_dir(bad, 0), 103)
    assert st["bg_state"] == "failed" and "truncated" in st["bg_error"] and st["version"] == 100
    assert enable(server, 103).status_code == 409
    # a dict of another version than claimed
    st = load(server, shard_dir(base, 0), 104)
    assert st["bg_state"] == "failed" and "version 100" in st["bg_error"]
    # a dict of another shard layout (built for 2 shards; this server is shard 0 of 1)
    two = build_version(tmp / "two", keys, values, version=105, shard_num=2)
    st = load(server, shard_dir(two, 0), 105)
    assert st["bg_state"] == "failed" and "shard 0/2" in st["bg_error"] and st["version"] == 100
    # bad bodies: 400; unload
    assert requests.post(http(server) + "/bg_load_base", json={"version": 1}).status_code == 400
    assert requests.post(http(server) + "/bg_load_base", data=b"[1]").status_code == 400
    assert requests.post(http(server) + "/bg_unload").status_code == 200
    assert requests.get(http(server) + "/status").json()["bg_state"] == "empty"
    assert Conn(server).seek(keys[:2])[1] == 100
    assert requests.get(http(server) + "/healthz").status_code == 200
    metrics = requests.get(http(server) + "/metrics").text
    assert "elastic_ctr_cube_requests_total" in metrics
    assert 'elastic_ctr_cube_loads_total{result="failed",shard="0",shard_num="1"} 4.0' in metrics


@pytest.mark.parametrize("io_mode", ["epoll", "threads"])
@pytest.mark.parametrize("frame,status", [
    (struct.pack("<I", 28) + b"XXXX" + bytes(24), protocol.BAD_REQUEST),               # bad magic
    (struct.pack("<I", 28 + 24) + protocol.encode_request(np.arange(4, dtype=np.uint64))[4:-8],
     protocol.BAD_REQUEST),                                                            # count/length disagree
    (struct.pack("<I", 2), protocol.BAD_REQUEST),                                      # shorter than a header
    (struct.pack("<I", 64 * 8 + 28 + 8), protocol.TOO_LARGE),                          # over the limit
])
def test_bad_frames_get_error_and_close(data, frame, status, io_mode):
    tmp, keys, values, base = data
    server = start_server(max_keys=64, io_mode=io_mode)
    try:
        load_and_enable(server, shard_dir(base, 0), 100)
        good = Conn(server)
        assert good.seek(keys[:10])[3].all()
        bad = Conn(server)
        bad.s.sendall(frame)
        with pytest.raises(protocol.ReplyError) as err:
            protocol.decode_reply(bad.recv_frame())
        assert err.value.status == status
        assert bad.closed()
        assert good.seek(keys[:64])[3].all()  # the other connection keeps being served
        assert Conn(server).seek(keys[:1])[1] == 100  # and new ones are accepted
    finally:
        server.stop()


def test_corrupt_patch_values_fail_the_load_and_keep_serving(server, data):
    """A patch whose values file is corrupt (found by its crc32 after the overlay was built
    from it) fails in the background; the served version keeps its answers."""
    tmp, keys, values, base = data
    load_and_enable(server, shard_dir(base, 0), 100)
    delta = build_version(tmp, keys[:50], values[:50] + 9, version=101, mode="delta", base_version=100)
    vf = Path(shard_dir(delta, 0)) / "values.f32"
    raw = bytearray(vf.read_bytes())
    raw[-1] ^= 0xFF
    vf.write_bytes(bytes(raw))
    st = load(server, shard_dir(delta, 0), 101, base_version=100)
    assert st["bg_state"] == "failed" and "crc32" in st["bg_error"] and st["version"] == 100
    _, version, _, found, vals = Conn(server).seek(keys[:60])
    assert version == 100 and found.all()
    np.testing.assert_array_equal(vals, values[:60])
    assert enable(server, 101).status_code == 409


def test_restart_restores_enabled_chain(tmp_path, data):
    tmp, keys, values, base = data
    state = tmp_path / "state"
    s1 = start_server(data_dir=str(state))
    try:
        load_and_enable(s1, shard_dir(base, 0), 100)
        delta = build_version(tmp, keys[:3], values[:3] * 0 + 2, version=101, mode="delta", base_version=100)
        load_and_enable(s1, shard_dir(delta, 0), 101, base_version=100)
    finally:
        s1.stop()
    s2 = start_server(data_dir=str(state))
    try:
        _, version, _, found, vals = Conn(s2).seek(keys[:5])
        assert version == 101 and found.all() and (vals[:3] == 2).all()
        np.testing.assert_array_equal(vals[3:], values[3:5])
    finally:
        s2.stop()


def test_restart_with_another_shard_num_starts_empty(tmp_path, data):
    """A resize restarts the server with a new --shard-num: the recorded chain (laid out
    for 1 shard) is not restored, and a dict of the old layout is refused on load."""
    tmp, keys, values, base = data
    state = tmp_path / "state"
    s1 = start_server(data_dir=str(state))
    try:
        load_and_enable(s1, shard_dir(base, 0), 100)
    finally:
        s1.stop()
    s2 = start_server(shard=0, shard_num=2, data_dir=str(state))
    try:
        st = requests.get(http(s2) + "/status", timeout=5).json()
        assert (st["version"], st["shard_num"], st["keys"]) == (None, 2, 0)
        st = load(s2, shard_dir(base, 0), 100)
        assert st["bg_state"] == "failed" and "shard 0/1" in st["bg_error"], st
        # the same version id built for 2 shards loads, and is enabled (not "already served")
        two = build_version(tmp / "two", keys, values, version=100, shard_num=2)
        load_and_enable(s2, shard_dir(two, 0), 100)
        _, version, _, found, vals = Conn(s2).seek(keys[shard_of(keys, 2) == 0][:5])
        assert version == 100 and found.all()
    finally:
        s2.stop()


def test_cli_server_process(tmp_path, data):
    """The server as a process: a version loaded over HTTP is answered through the data
    plane; SIGTERM ends it with exit code 0."""
    tmp, keys, values, base = data
    from runtime import auth, role_specs

    creds = auth.write_credentials(tmp_path / "credentials")
    headers = auth.Credential(role_specs.CUBE_CONTROL, creds).headers()
    with ProcessGroup(tmp_path / "logs", grace_s=5) as pg:
        role = pg.start("cube-server", [sys.executable, "-m", "runtime.cli", "cube", "server", "--shard", "0",
                                        "--shard-num", "1", "--dict-name", DICT, "--host", "127.0.0.1",
                                        "--port", "0", "--http-port", "0"], env=auth.env_for(creds), port_file=True)
        bound = pg.bound_ports(role)  # both accept from now on
        port, hport = bound["data"], bound["http"]
        url = f"http://127.0.0.1:{hport}"
        assert requests.get(url + "/healthz").status_code == 200
        assert requests.get(url + "/status").json()["kernel"] == "c"
        assert requests.post(url + "/bg_load_base", json={"dir": shard_dir(base, 0), "version": 100}).status_code == 401
        assert requests.post(url + "/bg_load_base", json={"dir": shard_dir(base, 0), "version": 100},
                             headers=headers).status_code == 202
        for _ in range(200):
            if requests.get(url + "/status").json()["bg_state"] == "loaded":
                break
            import time
            time.sleep(0.05)
        assert requests.post(url + "/enable", json={"version": 100}, headers=headers).status_code == 200
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(protocol.encode_request(keys[:100]))
        buf = b""
        while len(buf) < protocol.reply_size(100, 4):
            buf += s.recv(65536)
        _, version, _, found, vals = protocol.decode_reply(buf)
        assert version == 100 and found.all()
        np.testing.assert_array_equal(vals, values[:100])
        s.close()
        pg.stop(role)
        assert role.proc.returncode == 0
