"""A launcher (``elastic-ctr local``, ``train --local-cluster``) stopped with SIGTERM stops
every role it started (they run in their own sessions, out of the signal's reach) and
exits 0 (runtime.proc.Terminated)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

SCRIPT = """
import sys, time
from pathlib import Path
from runtime import proc
group = proc.ProcessGroup(Path(sys.argv[1]), grace_s=5)
def run(_args):
    with group:
        r = group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
        print("child", r.proc.pid, flush=True)
        time.sleep(120)
    return 1
try:
    rc = run(None)
except KeyboardInterrupt as exc:
    rc = 0 if isinstance(exc, proc.Terminated) else 130
sys.exit(rc)
"""


def test_sigterm_to_a_launcher_stops_its_roles_and_exits_0(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    line = p.stdout.readline()
    assert line.startswith("child "), line
    child = int(line.split()[1])
    os.kill(child, 0)  # running
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"role {child} still running after the launcher stopped")
