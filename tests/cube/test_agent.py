"""Cube agent: download (md5 verify, safe unpack), reload, enable, status, cleanup.

Runs the agent's Flask app in-process against ``FakeServer`` (the cube server's HTTP
control API held in memory, tests/helpers.py).
"""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from runtime.cube.agent import Agent, AgentError, create_app, safe_extract
from tests.helpers import FakeServer


def make_tar(path: Path, files: dict[str, bytes], top: str = "d_part0") -> str:
    """Writes a tar of ``files`` under the directory ``top``; returns its hex md5."""
    with tarfile.open(path, "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def agent(tmp_path, server):
    return Agent(server.url, tmp_path / "agent", load_timeout_s=10, poll_s=0.01)


@pytest.fixture
def client(agent):
    return create_app(agent).test_client()


def test_download_reload_enable(tmp_path, client, server, agent):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x" * 1000, "index": b"y" * 10})
    r = client.post("/download", json={"url": str(tar), "md5": md5, "version": 5, "mode": "base",
                                       "wait": 10})
    assert r.status_code == 200, r.json
    unpacked = Path(r.json["detail"]["dir"])
    assert unpacked == tmp_path / "agent" / "d" / "5" / "data" / "d_part0"
    assert (unpacked / "data").read_bytes() == b"x" * 1000
    # repeated download of a completed version: answered at once, nothing redone
    assert client.post("/download", json={"url": str(tar), "md5": md5, "version": 5}).status_code == 200
    assert client.post("/enable", json={"version": 5}).status_code == 409  # not downloaded->loaded yet
    server.enables.clear()
    r = client.post("/reload", json={"version": 5, "wait": 10})
    assert r.status_code == 200, r.json
    assert server.loads == [str(unpacked)]
    assert server.bg_version == 5 and server.version is None  # loaded, not serving yet
    r = client.post("/enable", json={"version": 5})
    assert r.status_code == 200, r.json
    assert server.version == 5
    st = client.get("/status").json
    assert st["version"] == 5 and st["step"] == "enable" and st["state"] == "done"
    assert st["steps"]["download"]["state"] == "done" and st["server"]["version"] == 5


def test_enable_before_reload_is_refused_by_server(tmp_path, client, server):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x"})
    assert client.post("/download", json={"url": str(tar), "md5": md5, "version": 1, "wait": 10}).status_code == 200
    r = client.post("/enable", json={"version": 1})
    assert r.status_code == 409 and r.json["step"] == "enable" and "not loaded" in r.json["error"]
    assert server.version is None


def test_md5_mismatch_fails_at_download_and_nothing_loaded(tmp_path, client, server, agent):
    tar = tmp_path / "d_part0.tar"
    make_tar(tar, {"data": b"x" * 100})
    r = client.post("/download", json={"url": str(tar), "md5": "0" * 32, "version": 7, "wait": 10})
    assert r.status_code == 500
    assert r.json["step"] == "download" and r.json["state"] == "failed"
    assert "md5 mismatch" in r.json["error"]
    st = client.get("/status").json
    assert (st["step"], st["state"]) == ("download", "failed") and "md5 mismatch" in st["error"]
    # nothing kept, nothing loadable
    assert not list((tmp_path / "agent").rglob("data"))
    r = client.post("/reload", json={"version": 7, "wait": 5})
    assert r.status_code == 409 and "not downloaded" in r.json["error"]
    assert server.loads == [] and server.bg_version is None


def test_truncated_tar_fails_at_download(tmp_path, client, server):
    tar = tmp_path / "d_part0.tar"
    make_tar(tar, {"data": b"x" * 5000})
    blob = tar.read_bytes()[:2048]  # cut inside the member's data
    tar.write_bytes(blob)
    md5 = hashlib.md5(blob).hexdigest()  # md5 of the truncated file: only the tar check catches it
    r = client.post("/download", json={"url": str(tar), "md5": md5, "version": 3, "wait": 10})
    assert r.status_code == 500 and r.json["step"] == "download"
    assert "truncated" in r.json["error"]
    assert not (tmp_path / "agent" / "d" / "3" / "data").exists()
    assert server.loads == []


def test_tar_truncated_at_member_boundary_detected(tmp_path):
    tar = tmp_path / "d_part0.tar"
    make_tar(tar, {"a": b"1" * 512, "b": b"2" * 512})
    tar.write_bytes(tar.read_bytes()[:3 * 512])  # header a, data a, header b: no end marker
    with pytest.raises(AgentError, match="truncated"):
        safe_extract(tar, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../evil", "/abs/evil", "d_part0/../../evil"])
def test_path_traversal_refused(tmp_path, client, server, name):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {name: b"pwned"}, top="")
    r = client.post("/download", json={"url": str(tar), "md5": md5, "version": 4, "wait": 10})
    assert r.status_code == 500 and r.json["step"] == "download"
    assert "escapes" in r.json["error"]
    assert not list(tmp_path.rglob("evil")) and not Path("/abs/evil").exists()
    assert server.loads == []


def test_symlink_member_refused(tmp_path):
    tar = tmp_path / "t.tar"
    with tarfile.open(tar, "w") as tf:
        info = tarfile.TarInfo("d_part0/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(AgentError, match="not a regular file"):
        safe_extract(tar, tmp_path / "out")


def test_reload_failure_reported_at_reload(tmp_path, client, server):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x"})
    server.fail_load.add(9)
    client.post("/download", json={"url": str(tar), "md5": md5, "version": 9, "wait": 10})
    r = client.post("/reload", json={"version": 9, "wait": 10})
    assert r.status_code == 500 and r.json["step"] == "reload" and "failed to load" in r.json["error"]
    assert server.version is None


def test_delta_reload_uses_bg_load_patch(tmp_path, client, server):
    for v, mode in ((10, "base"), (11, "delta")):
        tar = tmp_path / f"d_part0_{v}.tar"
        md5 = make_tar(tar, {"data": b"v%d" % v})
        body = {"url": str(tar), "md5": md5, "version": v, "mode": mode, "dict_name": "d", "wait": 10}
        if mode == "delta":
            body["base_version"] = 10
        assert client.post("/download", json=body).status_code == 200
        assert client.post("/reload", json={"version": v, "wait": 10}).status_code == 200
        assert client.post("/enable", json={"version": v}).status_code == 200
    assert server.enables == [10, 11]


def test_delta_on_wrong_base_fails_at_reload(tmp_path, client, server):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x"})
    client.post("/download", json={"url": str(tar), "md5": md5, "version": 12, "mode": "delta",
                                   "base_version": 99, "wait": 10})
    r = client.post("/reload", json={"version": 12, "wait": 10})
    assert r.status_code == 500 and r.json["step"] == "reload" and "409" in r.json["error"]


def test_bad_requests(client):
    assert client.post("/download", json={"url": "x"}).status_code == 400
    assert client.post("/download", json={"url": "x", "version": 1}).status_code == 400  # no md5
    assert client.post("/reload", json={}).status_code == 400
    assert client.post("/enable", json={"version": "nope"}).status_code == 400


def test_cleanup_keeps_current_and_previous(tmp_path, client, server, agent):
    for v in (1, 2, 3):
        tar = tmp_path / "d_part0.tar"
        md5 = make_tar(tar, {"data": b"%d" % v})
        assert client.post("/download", json={"url": str(tar), "md5": md5, "version": v, "wait": 10}).status_code == 200
        assert client.post("/reload", json={"version": v, "wait": 10}).status_code == 200
        assert client.post("/enable", json={"version": v}).status_code == 200
    left = sorted(p.name for p in (tmp_path / "agent" / "d").iterdir())
    assert left == ["2", "3"]


def test_bg_unload_forwards(client, server):
    server.bg_version, server.bg_state = 4, "loaded"
    assert client.post("/bg_unload").status_code == 200
    assert server.bg_version is None and server.unloads == 1


def test_cleanup_keeps_the_served_chain_and_survives_restart(tmp_path, client, server, agent):
    def roll(v, mode="base", base=None):
        tar = tmp_path / "d_part0.tar"
        md5 = make_tar(tar, {"data": b"%d" % v})
        body = {"url": str(tar), "md5": md5, "version": v, "mode": mode, "base_version": base, "wait": 10}
        assert client.post("/download", json=body).status_code == 200
        assert client.post("/reload", json={"version": v, "wait": 10}).status_code == 200
        assert client.post("/enable", json={"version": v}).status_code == 200

    def left():
        return sorted(int(p.name) for p in (tmp_path / "agent" / "d").iterdir())

    roll(1)
    for v in (2, 3, 4):
        roll(v, "delta", v - 1)
    assert left() == [1, 2, 3, 4]  # the served version is base 1 + patches 2, 3, 4
    roll(5)
    assert left() == [1, 2, 3, 4, 5]  # previous (4, with its chain) + current
    # a restarted agent remembers what it unpacked
    again = Agent(server.url, tmp_path / "agent", load_timeout_s=10, poll_s=0.01)
    assert sorted(again.versions) == [1, 2, 3, 4, 5] and again.enabled[-1] == 5
    c2 = create_app(again).test_client()
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"6"})
    assert c2.post("/download", json={"url": str(tar), "md5": md5, "version": 6, "wait": 10}).status_code == 200
    assert c2.post("/reload", json={"version": 6, "wait": 10}).status_code == 200
    assert c2.post("/enable", json={"version": 6}).status_code == 200
    assert left() == [5, 6]


def test_reload_after_abort_loads_again(tmp_path, client, server):
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x"})
    client.post("/download", json={"url": str(tar), "md5": md5, "version": 8, "wait": 10})
    assert client.post("/reload", json={"version": 8, "wait": 10}).status_code == 200
    assert client.post("/bg_unload").status_code == 200  # the transfer aborted the rollout
    assert server.bg_version is None
    # the retried rollout: reload must load again, not answer "done" from memory
    assert client.post("/reload", json={"version": 8, "wait": 10}).status_code == 200
    assert server.bg_version == 8 and server.bg_state == "loaded" and len(server.loads) == 2
    assert client.post("/enable", json={"version": 8}).status_code == 200


def test_same_version_with_another_md5_is_loaded_and_enabled_again(tmp_path, client, server, agent):
    """A re-layout sends the version already served, built anew (another md5): reload and
    enable must load and switch the new files, not answer 200 from the finished steps."""
    for i, payload in enumerate((b"2 shards", b"4 shards")):
        tar = tmp_path / f"{i}" / "d_part0.tar"
        tar.parent.mkdir()
        md5 = make_tar(tar, {"data": payload})
        assert client.post("/download", json={"url": str(tar), "md5": md5, "version": 7,
                                               "wait": 10}).status_code == 200
        assert client.post("/reload", json={"version": 7, "wait": 10}).status_code == 200
        assert client.post("/enable", json={"version": 7}).status_code == 200
        assert server.version == 7 and len(server.loads) == i + 1
        assert (Path(server.loads[-1]) / "data").read_bytes() == payload
    assert server.enables == [7, 7]  # switched twice: the second build was enabled too
    assert client.get("/status").json["enabled"] == [7]


def test_safe_extract_without_the_data_filter(tmp_path, monkeypatch):
    """Pythons before 3.11.4 (Debian bookworm's 3.11.2, the local base image) have no
    ``tarfile`` data filter: the agent still unpacks, with its own checks only."""
    tar = tmp_path / "v.tar"
    make_tar(tar, {"a.bin": b"x" * 100, "sub/b.bin": b"y" * 7})
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    names = safe_extract(tar, tmp_path / "out")
    assert (tmp_path / "out" / "d_part0" / "a.bin").read_bytes() == b"x" * 100
    assert (tmp_path / "out" / "d_part0" / "sub" / "b.bin").read_bytes() == b"y" * 7
    assert "d_part0/a.bin" in names
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"z"))
    with pytest.raises(AgentError, match="escapes"):
        safe_extract(evil, tmp_path / "out2")
    assert not (tmp_path / "escape.txt").exists()


def test_shutdown_starts_no_step_and_abandons_a_running_reload(tmp_path, server):
    """Once the process is stopping (``shutdown``, on SIGTERM), a running reload stops
    polling the server (it would outlive the process otherwise) and no new step starts:
    the commands answer 503, the transfer retries elsewhere or after the restart."""
    import time

    server.load_delay_s = 30.0  # the server's load outlasts the test
    agent = Agent(server.url, tmp_path / "agent", load_timeout_s=60, poll_s=0.01)
    client = create_app(agent).test_client()
    tar = tmp_path / "d_part0.tar"
    md5 = make_tar(tar, {"data": b"x"})
    assert client.post("/download", json={"url": str(tar), "md5": md5, "version": 3, "wait": 10}).status_code == 200
    r = client.post("/reload", json={"version": 3})
    assert r.status_code == 202 and r.json["state"] == "running", r.json
    agent.shutdown()
    deadline = time.monotonic() + 5
    while agent.steps["reload"].state == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    st = agent.steps["reload"]
    assert st.state == "failed" and "shutting down" in st.error, st
    for path, body in [("/reload", {"version": 3}), ("/download", {"url": str(tar), "md5": md5, "version": 4})]:
        r = client.post(path, json=body)
        assert r.status_code == 503 and "shutting down" in r.json["error"], (path, r.status_code, r.json)
    assert agent.steps["download"].version == 3  # nothing new began
