"""What the harness records for a test to assert on: the one rewrite's occurrences and pod
terminations (exit codes, times in seconds, readiness transitions)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Rewrite:
    """One occurrence of the one rewrite: ``field`` is ``env NAME`` or ``args[i]``."""

    pod: str
    container: str
    field: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.pod}/{self.container} {self.field}: {self.before!r} -> {self.after!r}"


@dataclass
class ContainerExit:
    """How one container of a terminated pod ended; times in seconds from the start of the
    termination."""

    container: str
    exit_code: Optional[int]
    seconds: Optional[float]      # from the start of the termination to the exit
    sigkilled: bool
    first_not_ready_s: Optional[float] = None  # readiness endpoint first failed (fast watcher)
    kubelet_not_ready_s: Optional[float] = None  # the kubelet-view readiness turned false


@dataclass
class Termination:
    """One pod deletion (``reason``: ``delete``, ``kill``, ``shutdown``, ``CompleteJob``, ...),
    its grace period (s), its containers' exits and the replacement pod's name, if any."""

    pod: str
    reason: str
    grace_s: float
    containers: list[ContainerExit] = field(default_factory=list)
    replacement: Optional[str] = None

    @property
    def clean(self) -> bool:
        """Every container exited 0 within the grace period."""
        return all(c.exit_code == 0 and not c.sigkilled for c in self.containers)

    def summary(self) -> str:
        """One line for logs and test reports."""
        parts = []
        for c in self.containers:
            s = f"{c.container}: exit {c.exit_code} after {c.seconds:.2f} s" if c.seconds is not None \
                else f"{c.container}: exit {c.exit_code}"
            if c.sigkilled:
                s += " (SIGKILL)" if self.reason == "kill" else " (SIGKILL after the grace period)"
            if c.first_not_ready_s is not None:
                s += f", readiness false at {c.first_not_ready_s:.2f} s"
            parts.append(s)
        return f"{self.pod} ({self.reason}, grace {self.grace_s:.0f} s): " + "; ".join(parts)
