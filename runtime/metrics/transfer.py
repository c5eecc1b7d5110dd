"""The cube transfer's Prometheus metrics (``elastic_ctr_transfer_*``), in a registry of its
own, set by ``runtime.cube.transfer.service.Transfer``:

* ``served_version`` (the id every replica serves; 0: none), ``served_data_end_timestamp_seconds``
  (its data time: the end of the last partition it was trained through, unix s, from its
  donefile line; NaN for a version without one), ``served_timestamp_seconds`` (when it
  was enabled everywhere, unix s);
* ``rollouts_total{status}`` (finished | failed | partial | refused), ``rollout_seconds``
  (histogram: donefile line seen -> every replica enabled), ``phase_seconds{phase}``
  (histogram per phase: building, deploying, downloading, reloading, enabling),
  ``rollout_phase{phase}`` (1 for the phase of the rollout in progress, else 0);
* ``landed_to_served_seconds`` (histogram, one per version: its last partition found
  complete by the trainer -> every replica serves it);
* ``pending_versions`` (published, newer than the served one), ``held_versions`` (of those,
  the ones held back: while the served chain is laid out on a new shard count or a
  server runs another ``--shard-num``; the quality gate's holds count here too when it
  lands), ``versions_failed_total`` (versions given up after their last attempt);
* ``donefile_malformed_lines_total``, ``polls_total``, ``last_poll_timestamp_seconds``;
* the process's ``process_*`` and its MLflow client's (``runtime.metrics.tracking``).
"""
from __future__ import annotations

from typing import Optional

from runtime.metrics import NAMESPACE

PHASES = ("building", "deploying", "downloading", "reloading", "enabling")
_SECONDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_LANDED = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


class TransferMetrics:
    """The families above (module docstring)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        from runtime.metrics.tracking import TrackingCollector

        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        r.register(TrackingCollector())
        ns, sub = NAMESPACE, "transfer"
        kw = {"namespace": ns, "subsystem": sub, "registry": r}
        self.version = Gauge("served_version", "version id served by every replica (0: none)", **kw)
        self.data_end = Gauge("served_data_end_timestamp_seconds", "data time of the served version: the end of "
                              "its last partition (unix s; NaN: unknown)", **kw)
        self.data_end.set(float("nan"))
        self.served_at = Gauge("served_timestamp_seconds", "when the served version was enabled everywhere "
                               "(unix s)", **kw)
        self.rollouts = Counter("rollouts", "rollouts by outcome", ["status"], **kw)
        self.rollout_s = Histogram("rollout_seconds", "donefile line seen -> every replica enabled (s)",
                                   buckets=_SECONDS, **kw)
        self.phase_s = Histogram("phase_seconds", "seconds of each rollout phase", ["phase"], buckets=_SECONDS,
                                 **kw)
        self.phase = Gauge("rollout_phase", "1 for the phase of the rollout in progress", ["phase"], **kw)
        self.landed_to_served = Histogram("landed_to_served_seconds", "a version's last partition found complete "
                                          "-> the version served by every replica (s)", buckets=_LANDED, **kw)
        self.pending = Gauge("pending_versions", "versions published and newer than the served one", **kw)
        self.held = Gauge("held_versions", "pending versions held back from their rollout", **kw)
        self.failed_versions = Counter("versions_failed", "versions given up after their last rollout attempt",
                                       **kw)
        self.versions_held = Counter("versions_held", "versions the model gate held (not rolled out: worse than "
                                     "the previous version on rows set aside)", **kw)
        self.malformed = Counter("donefile_malformed_lines", "malformed donefile lines skipped (each counted "
                                 "once)", **kw)
        self.polls = Counter("polls", "donefile polls", **kw)
        self.last_poll = Gauge("last_poll_timestamp_seconds", "the last donefile poll (unix s)", **kw)
        for status in ("finished", "failed", "partial", "refused"):  # every series exists from the start
            self.rollouts.labels(status)
        for p in PHASES:
            self.phase.labels(p).set(0)
            self.phase_s.labels(p)

    def in_phase(self, phase: Optional[str]) -> None:
        """The rollout in progress entered ``phase`` (lower case; None: no rollout)."""
        for p in PHASES:
            self.phase.labels(p).set(1 if p == phase else 0)

    def rollout_done(self, status: str, seconds: Optional[float], phases: dict[str, float],
                     given_up: bool = False) -> None:
        """A rollout ended with ``status``; its phases' seconds (``{phase: s}``, any case)."""
        self.in_phase(None)
        self.rollouts.labels(status).inc()
        if seconds is not None:
            self.rollout_s.observe(seconds)
        for p, s in phases.items():
            self.phase_s.labels(p.lower()).observe(s)
        if given_up:
            self.failed_versions.inc()

    def served(self, version: int, data_end: Optional[float], landed: Optional[float], served_at: float,
               new: bool = True) -> None:
        """``version`` is served everywhere since ``served_at`` (unix s), with its data time
        (``data_end``, ``landed``: unix s or None). ``new``: it was just rolled out (its
        landed-to-served is observed once)."""
        self.version.set(version)
        self.served_at.set(served_at)
        self.data_end.set(float("nan") if data_end is None else data_end)
        if new and landed is not None:
            self.landed_to_served.observe(max(0.0, served_at - landed))
