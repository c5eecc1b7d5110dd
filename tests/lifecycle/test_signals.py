"""The signal-handling defect behind serving's failed stops, pinned down alone: ``import
paddle`` replaces the process's SIGTERM handler with Paddle's (which prints ``FatalError:
`Termination signal` is detected`` and kills the process); ``runtime.inference.import_paddle``
keeps the process's own, from the main thread or any other (and the root logger's level,
which the import lowers to WARNING). And the supervisor's cleanup of a worker that exited:
its live gauges dropped (Prometheus' multiprocess files), a cleanup that fails logged, not
raised.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest


_PROBE = r"""
import logging, os, signal, sys, threading, time
logging.basicConfig(level=logging.INFO)
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
how = sys.argv[1]
if how == "plain":
    import paddle
elif how == "thread":
    from runtime.inference import import_paddle
    t = threading.Thread(target=import_paddle)
    t.start()
    t.join()
else:
    from runtime.inference import import_paddle
    import_paddle()
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 5
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
print("handled by python" if got else "not handled")
print("root logger level", logging.getLevelName(logging.root.level))
"""


def _probe(how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROBE, how], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("how", ["main", "thread"])
def test_import_paddle_keeps_the_process_sigterm_handler(how):
    r = _probe(how)
    assert r.returncode == 0 and "handled by python" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
    assert "FatalError" not in r.stdout + r.stderr
    assert "root logger level INFO" in r.stdout, r.stdout


def test_plain_paddle_import_takes_sigterm():
    """What ``import_paddle`` prevents (Paddle 3.0.0): the defect, reproduced."""
    r = _probe("plain")
    assert r.returncode != 0 and "handled by python" not in r.stdout, (r.returncode, r.stdout)
    out = r.stdout + r.stderr
    assert "FatalError" in out and "Termination signal" in out, out[-3000:]


def test_a_worker_exit_drops_its_gauges_and_a_failed_cleanup_is_logged(tmp_path, caplog):
    from prometheus_client import multiprocess

    from runtime.serving.launcher import Supervisor

    (tmp_path / "gauge_livesum_1.db").write_bytes(b"")  # another worker's
    calls = []

    def broken(pid):
        calls.append(pid)
        raise OSError(f"{tmp_path / 'gone'} is gone")

    for on_exit in (lambda pid: multiprocess.mark_process_dead(pid, str(tmp_path)), broken):
        sup = Supervisor(1, lambda index, started: 0, 1.0, on_exit)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until its gauge file exists (the parent closes its end)
            os._exit(0)
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
        os.close(w)
        sup.children[pid] = (0, r)
        deadline = time.monotonic() + 10
        while sup.children and time.monotonic() < deadline:
            sup._reap()
            time.sleep(0.01)
        assert not sup.children
        assert (tmp_path / f"gauge_livesum_{pid}.db").exists() == (on_exit is broken)
        assert (tmp_path / "gauge_livesum_1.db").exists()
    assert len(calls) == 1 and "cleanup after worker pid" in caplog.text
