"""The lifecycle checks themselves can fail: a crash in the output, a missing start line,
a non-zero exit, readiness never false while the process was up, or ready again after it
turned false are each caught."""
from __future__ import annotations

import pytest

from runtime import proc
from tests.lifecycle import support


def test_log_check_catches_a_crash(tmp_path):
    """Each check fails on the output or the stop that breaks it."""
    log_path = tmp_path / "x.log"
    log_path.write_text("x listening on http://127.0.0.1:5 (pid 1)\nTraceback (most recent call last):\n")

    class _P:
        pid = 1

    role = proc.Role("x", _P(), log_path)
    with pytest.raises(AssertionError, match="forbidden"):
        support.check_log(role, "127.0.0.1", [5])
    log_path.write_text("x listening on http://127.0.0.1:5 (pid 2)\n")
    with pytest.raises(AssertionError, match="no start line"):
        support.check_log(role, "127.0.0.1", [5])
    with pytest.raises(AssertionError, match="exit code"):
        support.check_stop(support.Stop(rc=-9, seconds=1.0, probes=[(0.1, 200, True)]), role)
    with pytest.raises(AssertionError, match="never false"):
        support.check_stop(support.Stop(rc=0, seconds=1.0, probes=[(0.1, 200, True), (0.2, "refused", False)]), role)
    with pytest.raises(AssertionError, match="ready again"):
        support.check_stop(support.Stop(rc=0, seconds=1.0, probes=[(0.1, 503, True), (0.2, 200, True)]), role)
