"""A serving worker that finished its graceful stop ends at once: ``ServerHooks.worker_exit``
skips the interpreter's finalization (in the container resize test Paddle's and gRPC's
C-level teardown outlasted ``--graceful-timeout`` and the pods were SIGKILLed), with its
buffered output flushed first; a worker that did not drain (a failed boot) goes the
normal way (its exit code is gunicorn's).

Each case runs in its own Python process; an ``atexit`` handler that would block for
``SLOW_S`` s stands in for the slow finalization.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

SLOW_S = 40

SCRIPT = textwrap.dedent("""
    import atexit, sys, time
    from runtime.serving.launcher import ServerHooks

    drained = sys.argv[1] == "drained"
    if drained:
        atexit.register(time.sleep, {slow})  # finalization that must not run
    print("buffered before the exit")  # stdout is a pipe: block-buffered, flushed by worker_exit

    class Worker:
        pass

    w = Worker()
    if drained:
        w.drained = True
    ServerHooks("unused", 5, lambda pid, d: None).worker_exit(None, w)
    print("worker_exit returned")
    sys.exit(3)
""").format(slow=SLOW_S)


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          timeout=SLOW_S / 2)


def test_drained_worker_ends_without_finalization_output_flushed():
    r = _run("drained")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "buffered before the exit" in r.stdout, r.stdout
    assert "worker_exit returned" not in r.stdout, r.stdout


def test_worker_not_drained_exits_the_normal_way():
    r = _run("failed-boot")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "worker_exit returned" in r.stdout, r.stdout
