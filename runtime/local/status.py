"""Waiting on the local pipeline's roles: polling with the run's deadline, the version
serving answers with, the trainer's summary line. Used by both flows of ``elastic-ctr
local`` (``runtime.local.pipeline`` rounds, ``runtime.local.online``).
"""
from __future__ import annotations

import time
from pathlib import Path

from runtime import role_specs


class Waiter:
    """Polling with the run's deadline: ``until(cond, what, timeout_s)`` returns the first
    truthy ``cond()``, checking ``group`` (a ``proc.ProcessGroup``: a failed role raises
    ``proc.RoleFailed``) between polls; ``TimeoutError`` naming ``what`` after ``timeout_s``
    s or past the deadline (``timeout_s`` s from now)."""

    def __init__(self, group, timeout_s: float):
        self.group = group
        self.deadline = time.monotonic() + timeout_s

    def left(self) -> float:
        """Seconds to the run's deadline (at least 1)."""
        return max(1.0, self.deadline - time.monotonic())

    def until(self, cond, what: str, timeout_s: float, poll_s: float = 0.1):
        """The first truthy ``cond()``, polled every ``poll_s`` s. Raises ``TimeoutError``
        after ``timeout_s`` s (or at the run's deadline), ``proc.RoleFailed``."""
        end = min(self.deadline, time.monotonic() + timeout_s)
        while time.monotonic() < end:
            self.group.check()
            v = cond()
            if v:
                return v
            time.sleep(poll_s)
        raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")

    def wait(self, roles, what: str = "") -> None:
        """Waits until every role of ``roles`` (started with ``expect_exit=True``) exited 0,
        at most until the run's deadline. Raises ``proc.RoleFailed`` / ``TimeoutError``."""
        self.group.wait(roles, timeout_s=self.left())


def serving_version(serving_url: str) -> int | None:
    """The version serving answers with once ready (``GET /v2/health/ready``, 2 s timeout),
    else None (not ready, not answering)."""
    import requests

    try:
        r = requests.get(serving_url + role_specs.V2_READY, timeout=2)
        return int(r.json()["model_version"]) if r.status_code == 200 else None
    except (requests.RequestException, ValueError, KeyError):
        return None


def summary_line(log_path: Path) -> dict:
    """The last ``ELASTIC_CTR_SUMMARY {json}`` line a ``train --local-cluster`` run printed
    to ``log_path`` (``runtime.formats.train_result``), as a dict; ``{}`` if none. Raises
    ``TrainResultError`` naming the log when the line is malformed."""
    from runtime.formats.train_result import SUMMARY, TrainResult

    rec = TrainResult.find(log_path.read_text(errors="replace"), SUMMARY, source=str(log_path))
    return rec.to_dict() if rec is not None else {}

