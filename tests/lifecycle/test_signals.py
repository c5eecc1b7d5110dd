"""The two signal-handling defects behind serving's failed stops, each pinned down alone:

- ``import paddle`` replaces the process's SIGTERM handler with Paddle's (which prints
  ``FatalError: `Termination signal` is detected`` and kills the process);
  ``runtime.inference.import_paddle`` keeps the process's own, from the main thread or
  any other (and the root logger's level, which the import lowers to WARNING).
- gunicorn's master runs ``child_exit`` inside its SIGCHLD handler: the hook must import
  nothing (an import there, re-entered while the first was half done, raised
  ``ImportError: cannot import name 'Gauge' from partially initialized module``) and must
  never raise.
"""
from __future__ import annotations

import builtins
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from runtime.serving.launcher import ServerHooks

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


def test_child_exit_imports_nothing_and_never_raises(tmp_path, monkeypatch):
    from prometheus_client import multiprocess

    (tmp_path / "gauge_livesum_4242.db").write_bytes(b"")
    (tmp_path / "gauge_livesum_4243.db").write_bytes(b"")
    hooks = ServerHooks(str(tmp_path), 10, multiprocess.mark_process_dead)

    def no_import(name, *args, **kwargs):
        raise ImportError(f"import of {name} inside child_exit")

    monkeypatch.setattr(builtins, "__import__", no_import)
    hooks.child_exit(None, SimpleNamespace(pid=4242))
    monkeypatch.undo()
    assert not (tmp_path / "gauge_livesum_4242.db").exists()
    assert (tmp_path / "gauge_livesum_4243.db").exists()

    def broken(pid, path):
        raise OSError(f"{path} is gone")

    ServerHooks(str(tmp_path / "gone"), 10, broken).child_exit(None, SimpleNamespace(pid=1))  # logged, not raised
