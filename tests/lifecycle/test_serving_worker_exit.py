"""serving's supervisor (``runtime.serving.launcher.Supervisor``) and its workers' exit,
with stand-in workers (no model, no server):

- a worker ends at once (``exit_now``): no interpreter finalization (Paddle's and gRPC's
  C-level teardown can outlast ``--grace-period-seconds``), its buffered output flushed first;
- SIGTERM to the supervisor: every worker gets SIGTERM, and the supervisor exits 0 once
  they all exited 0 (1 when one did not); a worker still running after the grace is
  SIGKILLed;
- a worker that dies while serving is started again; one that dies before it served stops
  everything with exit code 3 (gunicorn's "worker failed to boot").

Each case runs the supervisor in its own Python process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SLOW_S = 40
REPO = Path(__file__).resolve().parents[2]

EXIT_NOW = textwrap.dedent("""
    import atexit, sys, time
    from runtime.serving.launcher import exit_now

    atexit.register(time.sleep, {slow})  # finalization that must not run
    print("buffered before the exit")  # stdout is a pipe: block-buffered, flushed by exit_now
    exit_now(0)
    print("exit_now returned")
""").format(slow=SLOW_S)

#: a supervisor of 2 stand-in workers; argv[1] is the mode, argv[2] a directory for their traces
SUPERVISED = textwrap.dedent("""
    import logging, os, signal, sys, time
    from pathlib import Path
    from runtime.serving import launcher

    logging.basicConfig(level=logging.INFO)
    launcher.RESTART_DELAY_S = 0.2
    mode, out = sys.argv[1], Path(sys.argv[2])

    def worker(index, started):
        (out / f"start-{{index}}-{{os.getpid()}}").touch()
        if mode == "boot-fails" and index == 1:
            time.sleep(0.5)
            return 2  # before it served
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        if mode == "stubborn" and index == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        started()
        while not stop:
            time.sleep(0.02)
        (out / f"stopped-{{index}}-{{os.getpid()}}").touch()
        return 1 if mode == "one-fails-its-stop" and index == 1 else 0

    print("supervisor exits", launcher.Supervisor(2, worker, grace_s={grace}).run(), flush=True)
""")


def _supervise(mode: str, tmp_path: Path, grace_s: float = 5.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SUPERVISED.format(grace=grace_s), mode, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)


def _wait_files(tmp_path: Path, prefix: str, n: int, timeout_s: float = 30.0) -> list[Path]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(tmp_path.glob(prefix + "*"))
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{n} {prefix}* files expected in {timeout_s} s, found {sorted(tmp_path.iterdir())}")


def test_exit_now_skips_finalization_with_output_flushed():
    r = subprocess.run([sys.executable, "-c", EXIT_NOW], capture_output=True, text=True, timeout=SLOW_S / 2,
                       cwd=REPO)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "buffered before the exit" in r.stdout and "exit_now returned" not in r.stdout, r.stdout


@pytest.mark.parametrize("mode, code", [("clean", 0), ("one-fails-its-stop", 1)])
def test_sigterm_stops_every_worker_then_the_supervisor(tmp_path, mode, code):
    p = _supervise(mode, tmp_path)
    try:
        _wait_files(tmp_path, "start-", 2)
        time.sleep(0.5)  # both serve
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, out  # the supervisor's own process ends normally, printing its code
    assert f"supervisor exits {code}" in out, out
    assert len(list(tmp_path.glob("stopped-*"))) == 2, out


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    p = _supervise("stubborn", tmp_path, grace_s=0.5)
    try:
        _wait_files(tmp_path, "start-", 2)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        p.kill()
    assert "supervisor exits 1" in out and "SIGKILL" in out, out
    assert took < 0.5 + 5.0 + 5.0, took  # the grace, KILL_AFTER_S, and a margin


def test_a_worker_dying_while_serving_is_started_again(tmp_path):
    p = _supervise("clean", tmp_path)
    try:
        first = _wait_files(tmp_path, "start-", 2)
        time.sleep(0.5)
        pid = int(first[0].name.split("-")[2])
        os.kill(pid, signal.SIGKILL)
        _wait_files(tmp_path, "start-", 3)  # a third start: the one killed, again
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert "while serving: starting it again" in out and "supervisor exits 0" in out, out


def test_a_worker_dying_before_it_served_stops_everything(tmp_path):
    p = _supervise("boot-fails", tmp_path)
    try:
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert "supervisor exits 3" in out and "before it served: stopping" in out, out
    assert len(list(tmp_path.glob("stopped-0-*"))) == 1, out  # the other one was stopped
