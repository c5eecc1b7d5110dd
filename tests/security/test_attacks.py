"""Attacks on the control planes, at process level: a local cube (file server, 1 shard x
2 replicas of cube server + agent, transfer; ``LocalCubeCluster``, credentials generated
per run) serving one version while a client looks keys up without pause.

Against every state-changing endpoint (the agents' download/reload/enable/bg_unload, the
servers' bg_load_base/bg_load_patch/enable/bg_unload, the file server's PUT), a client
with no credential, a wrong one, a malformed header, and the previous one after a
rotation completed is refused 401 with a JSON error that names no credential; nothing
changes (the served version, the file server's files) and no download is attempted (a
listener the test runs as the download URL sees no connection). A credentialed download
of a URL outside the version root, a local path or a file URL is refused 400, with no
connection either. During a rotation both credentials are accepted, and once it is
over the transfer rolls a new version out with the new one, without a restart. The
client's lookups meanwhile: 0 failed, every answer the served version's values. The
refusals are counted in ``elastic_ctr_auth_refusals_total`` and no credential reaches a
log.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import requests

from runtime import auth, role_specs
from tests.helpers import table_from_files, write_version

DIM, N = 4, 2000
V1, V2 = 2001, 2002


class Listener:
    """A TCP listener on 127.0.0.1 counting the connections made to it (a download URL
    that must never be fetched)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class Lookups:
    """A client looking every key up without pause in a thread; ``failed`` counts errors
    and answers that differ from the expected values."""

    def __init__(self, topology, keys, values):
        from runtime.cube.client import CubeClient

        self.client = CubeClient.from_topology(topology, timeout_ms=2000)
        self.keys, self.values = keys, values
        self.requests = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.requests += 1
            try:
                res = self.client.seek(self.keys)
                if res.version != V1 or not res.found.all() or not np.array_equal(res.values, self.values):
                    self.failed += 1
                    self.errors.append(f"answer of version {res.version} differs")
            except Exception as exc:  # noqa: BLE001 - counted
                self.failed += 1
                self.errors.append(repr(exc))
            time.sleep(0.005)

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.client.close()


@pytest.fixture(scope="module")
def cube(tmp_path_factory):
    from runtime.local.cube import LocalCubeCluster

    base = tmp_path_factory.mktemp("attacks")
    with LocalCubeCluster(base / "run", base / "root", shards=1, replicas=2, poll_interval_s=0.1) as c:
        rng = np.random.default_rng(0)
        keys = rng.choice(1 << 40, N, replace=False).astype(np.uint64)
        files = write_version(c.root, V1, keys, rng.standard_normal((N, DIM)).astype(np.float32), parts=1)
        c.publish_version(V1, V1, dim=DIM, count=N)
        c.wait_version(V1, timeout_s=60)
        table = table_from_files(files)
        c.keys = np.fromiter(table.keys(), np.uint64, len(table))
        c.values = np.stack([table[k] for k in c.keys.tolist()])
        yield c


def _endpoints(cube, listener_url: str) -> list[tuple[str, str, dict]]:
    """Every state-changing request: ``(method, url, json body)``; the download names the listener."""
    out = []
    for (_s, _r), (_data, http, agent) in sorted(cube.layout.addresses.items()):
        out += [("POST", f"{agent}/download", {"url": listener_url, "md5": "0" * 32, "version": V2, "wait": 5}),
                ("POST", f"{agent}/reload", {"version": V1}), ("POST", f"{agent}/enable", {"version": V1}),
                ("POST", f"{agent}/bg_unload", {}),
                ("POST", f"{http}/bg_load_base", {"dir": "/tmp", "version": V2}),
                ("POST", f"{http}/bg_load_patch", {"dir": "/tmp", "version": V2, "base_version": V1}),
                ("POST", f"{http}/enable", {"version": V1}), ("POST", f"{http}/bg_unload", {})]
    out.append(("PUT", f"{cube.root_url}/versions/{V1}/sparse/part-00000", {}))
    out.append(("PUT", f"{cube.root_url}/cube/evil.tar", {}))
    return out


def _served(cube) -> list:
    return [requests.get(f"{http}/status", timeout=5).json()["version"] for _d, http, _a in cube.layout.addresses.values()]


def _files(cube) -> dict[str, bytes]:
    return {str(p.relative_to(cube.root)): p.read_bytes() for p in sorted(cube.root.rglob("*")) if p.is_file()}


def _attack(cube, listener, headers_list, secrets_) -> int:
    """Sends every state-changing request with each of ``headers_list``; each must be a
    401 naming no secret. Returns the number of requests sent."""
    sent = 0
    for method, url, body in _endpoints(cube, f"http://127.0.0.1:{listener.port}/cube/x.tar"):
        for headers in headers_list:
            r = requests.request(method, url, json=body if method == "POST" else None,
                                 data=b"poison" if method == "PUT" else None, headers=headers, timeout=10)
            sent += 1
            assert r.status_code == 401, (method, url, headers.keys(), r.status_code, r.text)
            err = r.json()["error"]
            assert err and r.headers["WWW-Authenticate"].startswith("Bearer")
            assert not any(s in r.text for s in secrets_), r.text
    return sent


def test_refused_without_current_credential_and_nothing_changes(cube):
    t0 = time.monotonic()
    creds = cube.credentials_dir
    control = auth.Credential(role_specs.CUBE_CONTROL, creds)
    old = control.current()
    listener = Listener()
    load = Lookups(cube.topology, cube.keys, cube.values)
    files_before, served_before = _files(cube), _served(cube)
    try:
        assert served_before == [V1, V1]
        missing = [{}]
        wrong = [{"Authorization": "Bearer not-the-credential"}, {"Authorization": f"Basic {old}"},
                 {"Authorization": "Bearer"}]
        secrets_ = [old, auth.Credential(role_specs.FILES_WRITE, creds).current()]
        sent = _attack(cube, listener, missing + wrong, secrets_)

        # a rotation of cube-control: while it rolls out, old and new are both accepted (an enable of
        # the served version is answered 200 and changes nothing)
        new = auth.rotate(creds, role_specs.CUBE_CONTROL)
        write_new = auth.rotate(creds, role_specs.FILES_WRITE)
        _d, http, agent = cube.layout.addresses[(0, 0)]
        for value in (old, new):
            r = requests.post(f"{http}/enable", json={"version": V1}, headers={"Authorization": f"Bearer {value}"},
                              timeout=10)
            assert r.status_code == 200, r.text
        # ... and once it is over the previous one is refused everywhere
        auth.retire_previous(creds, role_specs.CUBE_CONTROL)
        auth.retire_previous(creds, role_specs.FILES_WRITE)
        old_write = secrets_[1]
        previous = [{"Authorization": f"Bearer {old}"}]
        sent += _attack(cube, listener, previous, [old, new, write_new])
        put = requests.put(f"{cube.root_url}/cube/evil.tar", data=b"x", headers={"Authorization": f"Bearer {old_write}"},
                           timeout=10)
        assert put.status_code == 401

        # a credentialed download outside the version root, of a local path or a file URL: 400, no connection
        ok = {"Authorization": f"Bearer {new}"}
        for url in (f"http://127.0.0.1:{listener.port}/cube/x.tar", f"{cube.root_url}/versions/{V1}/sparse/part-00000",
                    f"{cube.root_url}/cube/../versions/x.tar", "/etc/passwd", "file:///etc/passwd"):
            r = requests.post(f"{agent}/download", json={"url": url, "md5": "0" * 32, "version": V2, "wait": 5},
                              headers=ok, timeout=10)
            assert r.status_code == 400 and "refused" in r.json()["error"], (url, r.text)
        # a load of a directory outside the server's load root: 400
        r = requests.post(f"{http}/bg_load_base", json={"dir": str(cube.root), "version": V2}, headers=ok, timeout=10)
        assert r.status_code == 400 and "load root" in r.json()["error"], r.text
        time.sleep(0.3)
        assert listener.connections == 0
        assert _served(cube) == served_before
        assert _files(cube) == files_before

        # counted, by role, route and reason
        text = requests.get(f"{agent}/metrics", timeout=5).text
        for reason in ("missing", "malformed", "wrong"):
            assert f'elastic_ctr_auth_refusals_total{{endpoint="/download",reason="{reason}",role="cube-agent"}}' in text
        assert 'reason="wrong",role="cube-server"' in requests.get(f"{http}/metrics", timeout=5).text
        assert 'role="fileserver"' in requests.get(f"{cube.root_url}/metrics", timeout=5).text
        # no credential in any role's log
        logs = "".join(p.read_text(errors="replace") for p in cube.group.log_dir.glob("*.log"))
        assert logs and not any(s in logs for s in (old, new, old_write, write_new))
        print(f"{sent} refused requests, {load.requests} lookups meanwhile, {time.monotonic() - t0:.1f} s")
    finally:
        load.stop()
        listener.close()
    assert load.failed == 0, load.errors[:5]
    assert load.requests > 10


def test_transfer_rolls_out_with_the_rotated_credentials(cube):
    """After the rotation above (new current, previous removed), the transfer, which reads
    the files at each command and upload, rolls a new version out without a restart."""
    rng = np.random.default_rng(1)
    write_version(cube.root, V2, cube.keys, rng.standard_normal((len(cube.keys), DIM)).astype(np.float32), parts=1)
    cube.publish_version(V2, V2, dim=DIM, count=len(cube.keys))
    cube.wait_version(V2, timeout_s=60)
    assert _served(cube) == [V2, V2]
