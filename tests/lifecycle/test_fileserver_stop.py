"""``elastic-ctr fileserver`` stopped by SIGTERM while large downloads (read slowly, so
they are certainly in flight) and an upload (half its body sent at the signal) are in
flight: every one completes with 200/201 and the right bytes, readiness is false (the
port refuses) while they still run, and the process exits 0 within the bound with its
start line and no traceback in its output."""
from __future__ import annotations

import base64
import hashlib
import http.client
import threading
import time

import numpy as np
import requests

from runtime import proc
from tests.lifecycle import support

FILE_BYTES = 24 << 20   # each download
DOWNLOADS = 4
CHUNK = 256 << 10       # read per step by the slow client
STEP_S = 0.02           # pause between reads: a download takes about 2 s
UPLOAD_BYTES = 8 << 20
TOKEN = "lifecycle-token"


class _Download(threading.Thread):
    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.started = threading.Event()
        self.result = None  # (status, md5, bytes, monotonic time done) or the exception

    def run(self) -> None:
        try:
            with requests.get(self.url, stream=True, timeout=30) as r:
                md5, n = hashlib.md5(), 0
                for chunk in r.iter_content(CHUNK):
                    md5.update(chunk)
                    n += len(chunk)
                    self.started.set()
                    time.sleep(STEP_S)
                self.result = (r.status_code, md5.hexdigest(), n, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.result = exc
        finally:
            self.started.set()


class _Upload(threading.Thread):
    """PUT with half the body sent before ``go`` is set, the rest after."""

    def __init__(self, port: int, path: str, body: bytes, go: threading.Event):
        super().__init__(daemon=True)
        self.port, self.path, self.body, self.go = port, path, body, go
        self.started = threading.Event()
        self.result = None  # (status, response body, monotonic time done) or the exception

    def run(self) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.putrequest("PUT", self.path)
            c.putheader("Authorization", f"Bearer {TOKEN}")
            c.putheader("Content-Length", str(len(self.body)))
            c.putheader("Content-MD5", base64.b64encode(hashlib.md5(self.body).digest()).decode())
            c.endheaders()
            c.send(self.body[:len(self.body) // 2])
            self.started.set()
            self.go.wait(30)
            c.send(self.body[len(self.body) // 2:])
            r = c.getresponse()
            self.result = (r.status, r.read(), time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.result = exc
        finally:
            self.started.set()
            c.close()


def test_fileserver_finishes_transfers_in_flight_on_sigterm(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    data = np.random.default_rng(0).bytes(FILE_BYTES)
    (root / "big.bin").write_bytes(data)
    want_md5 = hashlib.md5(data).hexdigest()
    upload = np.random.default_rng(1).bytes(UPLOAD_BYTES)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with proc.ProcessGroup(tmp_path / "logs", grace_s=10) as group:
        role = support.start(group, "fileserver", ["fileserver", "--root", str(root), "--host", "127.0.0.1",
                                                   "--port", "0", "--upload-token-file", str(token)])
        port = group.bound_ports(role)["http"]
        url = f"http://127.0.0.1:{port}"
        support.wait_ready(role, url + "/readyz", timeout_s=60)
        go = threading.Event()
        downloads = [_Download(url + "/big.bin") for _ in range(DOWNLOADS)]
        up = _Upload(port, "/incoming/up.bin", upload, go)
        for t in downloads + [up]:
            t.start()
        for t in downloads + [up]:
            assert t.started.wait(30)
        watch = support.StopWatch(role, url + "/readyz")
        t_signal = watch.start()
        time.sleep(0.3)
        go.set()
        for t in downloads + [up]:
            t.join(60)
        stop = watch.result()

    bad = [t.result for t in downloads
           if not isinstance(t.result, tuple) or t.result[:3] != (200, want_md5, FILE_BYTES)]
    assert not bad, f"downloads in flight at SIGTERM: {bad}; log:\n{proc.tail(role.log_path)}"
    assert isinstance(up.result, tuple) and up.result[0] == 201, f"upload: {up.result}"
    assert (root / "incoming" / "up.bin").read_bytes() == upload
    done = [t.result[3] - t_signal for t in downloads] + [up.result[2] - t_signal]
    assert min(done) > 0, f"finished before the signal: {done}"
    support.check_stop(stop, role)
    assert max(done) < stop.seconds
    support.check_log(role, "127.0.0.1", [port])
    print(f"fileserver: transfers done {min(done):.2f}-{max(done):.2f} s after SIGTERM, exit after "
          f"{stop.seconds:.2f} s; probes {[p[1] for p in stop.probes][:5]}...")
