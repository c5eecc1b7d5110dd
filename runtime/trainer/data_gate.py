"""The data gate: each landed partition is checked before it is trained on (as TFX's
ExampleValidator checks a span against a schema and the previous spans' statistics).

Trainer 0 measures the partition on its shard of the lines (``statistics``:
``runtime.formats.partition_stats.PartitionStats``) and the served model's AUC and log
loss on it (the continuous job's ``auc_before``), then the checks
(``runtime.trainer.gate_checks``) compare them with

* the schema (``runtime.formats.data_schema``, ``--data-schema``): click rate range, each
  slot's missing rate, each dense feature's mean and saturated fraction;
* the last ``--gate-window`` accepted partitions (their median, once
  ``--gate-min-history`` exist): row count and click rate (ratio bounds), each slot's
  missing rate (absolute shift), each dense feature's histogram (Jensen-Shannon distance to
  the window's mean histogram), each slot's top values (L-infinity distance of their
  frequencies to the window's median, ``partition_stats.linf_distance``) and distinct
  values (a fall by more than a ratio, in count and per row read), the new-feasign rate
  (absolute increase), the model's AUC (drop) and log loss (ratio).

A lasting shift (``--gate-adapt-after`` partitions in a row that break only these drift
bounds and agree with each other) is taken as the new normal: those partitions become the
window and the last one is trained (``DataGate.judge``); a broken partition (schema,
malformed lines, a slot that lost its distinct values, the served model's AUC or log
loss) never is. Otherwise, any bound
broken, or more malformed lines than the bad-line budget allows, and the partition is
quarantined (``DataGate.quarantine``): not trained on, a ``_QUARANTINED``
marker beside its ``_SUCCESS`` (``partition_stats.write_marker``), an entry in the gate's
history (``--state-dir/data-gate.json``), ``elastic_ctr_trainer_partitions_quarantined_total``
and one log line per anomaly; the caller tags the MLflow run. Accepted partitions join the
window. Every trainer follows trainer 0's verdict (``admit``).

The new-feasign rate uses a sketch (``FeasignSketch``): a table of ``2**SKETCH_BITS``
16-bit stamps indexed by a multiplicative hash of the feasign, holding the last accepted
partition that saw it; a feasign whose slot's stamp is older than the window counts as new
(collisions make a few new feasigns look seen: the rate is compared only with its own
history, so the bias cancels). It is kept in memory: after a restart the rate is compared
again once the window has filled.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import numpy as np

from runtime.formats import data_schema, features, partition_stats as ps
from runtime.formats.partition_stats import Anomaly, PartitionStats
from runtime.trainer.gate_checks import Thresholds, check_history, check_schema

log = logging.getLogger(__name__)

SKETCH_BITS = 24
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class FeasignSketch:
    """Recently seen feasigns (module docstring): 2**``bits`` uint16 stamps (128 MiB at 26
    bits, 32 MiB at the default 24)."""

    def __init__(self, bits: int = SKETCH_BITS):
        self.shift = np.uint64(64 - bits)
        self.stamps = np.zeros(1 << bits, np.uint16)
        self.partitions = 0  # accepted partitions added (stamp of the last one)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * _GOLDEN) >> self.shift).astype(np.int64)

    def new_rate(self, keys: np.ndarray, window: int) -> Optional[float]:
        """The fraction of ``keys`` (uint64[n], occurrences) not seen in the last ``window``
        partitions added; None until ``window`` partitions were added or for no keys."""
        if self.partitions < window or len(keys) == 0:
            return None
        st = self.stamps[self._slots(keys)].astype(np.int64)
        seen = (st > 0) & (((self.partitions - st) % 65535) < window)
        return float(1.0 - seen.mean())

    def add(self, keys: np.ndarray) -> None:
        """Stamps ``keys`` (uint64[n]) as seen by the next partition."""
        self.partitions += 1
        stamp = (self.partitions - 1) % 65535 + 1
        self.stamps[self._slots(keys)] = stamp


def present_keys(feasigns: np.ndarray, slots: Sequence[int]) -> np.ndarray:
    """The non-missing feasigns of ``feasigns`` uint64[n, S] (``slots``: the S slot ids),
    flattened (uint64[m])."""
    miss = features.missing_feasign(np.asarray(slots))
    return feasigns[feasigns != miss[None, :]]


def statistics(hour: str, labels: np.ndarray, dense: np.ndarray, feasigns: np.ndarray, slots: Sequence[int],
               sketch: Optional[FeasignSketch] = None, window: int = 0, auc: Optional[float] = None,
               logloss: Optional[float] = None) -> PartitionStats:
    """A partition's statistics (``PartitionStats``) from its parsed rows: ``labels``
    int64[n], ``dense`` float32[n, 13] normalized to [0, 1], ``feasigns`` uint64[n, S];
    the new-feasign rate against ``sketch``'s last ``window`` partitions."""
    n = len(labels)
    miss = features.missing_feasign(np.asarray(slots))
    missing = (feasigns == miss[None, :]).mean(axis=0) if n else np.zeros(len(slots))
    hist = []
    for i in range(dense.shape[1]):
        h, _ = np.histogram(dense[:, i], bins=ps.DENSE_BINS, range=(0.0, 1.0))
        hist.append([round(float(x), 6) for x in (h / max(n, 1))])
    sat = (dense >= 1.0).mean(axis=0) if n else np.zeros(dense.shape[1])
    rate = sketch.new_rate(present_keys(feasigns, slots), window) if sketch is not None else None
    m, top, distinct = ps.categorical(feasigns, miss)
    return PartitionStats(hour=hour, rows=int(n), click_rate=round(float(labels.mean()) if n else 0.0, 6),
                          missing_rate=[round(float(x), 6) for x in missing], dense_hist=hist,
                          dense_saturated=[round(float(x), 6) for x in sat],
                          new_feasign_rate=None if rate is None else round(rate, 6), auc=auc, logloss=logloss,
                          categorical_rows=m, top_values=top, distinct=distinct)


def log_loss(labels: np.ndarray, p: np.ndarray) -> float:
    """Mean binary log loss of probabilities ``p`` float[n] for ``labels`` {0,1}[n]
    (``p`` clipped to [1e-7, 1 - 1e-7])."""
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if len(y) else float("nan")


def score(worker, staged, rec, rows: int) -> tuple[Optional[float], Optional[float]]:
    """Trainer 0: the model's ``(auc, logloss)`` on the first ``rows`` of its staged rows
    before training on them (the next-hour figures), also set on ``rec`` (a
    ``PartitionResult``); ``(None, None)`` when the rows were not kept."""
    from runtime.trainer import readers

    hold = staged.holdout
    if hold is None:
        return None, None
    n = min(len(hold), rows)
    sample = readers.Batch(hold.labels[:n], hold.dense[:n], hold.feasigns[:n])
    auc, p = worker.evaluate(sample)
    rec.auc_before, rec.logloss_before = round(auc, 6), round(log_loss(sample.labels, p), 6)
    log.info("%s: partition %s: auc %.4f (log loss %.4f) before training on it (%d rows)", worker.who, rec.hour,
             rec.auc_before, rec.logloss_before, n)
    return rec.auc_before, rec.logloss_before


def active(cfg) -> bool:
    """True when the continuous job gates its partitions (a window or a schema is set)."""
    return cfg.gate_window > 0 or bool(cfg.data_schema)


class DataGate:
    """Trainer 0's gate of one continuous job (module docstring). ``cfg``: the job's
    ``TrainConfig``; ``slots``: the slot ids. Raises ``data_schema.SchemaError`` or
    ``storage.LocationError`` for a schema that cannot be used, ``ValueError`` for a bad
    history file: before anything is trained."""

    def __init__(self, cfg, slots: Sequence[int]):
        from runtime import storage

        self.th = Thresholds.of(cfg)
        self.slots = list(slots)
        self.names = [f"C{s}" for s in self.slots]
        self.schema = data_schema.load(cfg.data_schema) if cfg.data_schema else None
        if self.schema is not None:
            self.schema.check_job(cfg.format, self.slots, f"--data-schema {cfg.data_schema}")
        self.state_dir = cfg.state_dir
        self.history = ps.GateHistory.load(cfg.state_dir)
        self.sketch = FeasignSketch() if self.th.window > 0 else None
        self.token = storage.read_token(cfg.upload_token_file)

    def judge(self, hour: str, labels: np.ndarray, dense: np.ndarray, feasigns: np.ndarray,
              auc: Optional[float] = None, logloss: Optional[float] = None) -> tuple[PartitionStats, list[Anomaly]]:
        """The partition's statistics and the bounds they break (empty: accepted)."""
        stats = statistics(hour, labels, dense, feasigns, self.slots, self.sketch, self.th.window, auc, logloss)
        out = check_schema(stats, self.schema) if self.schema is not None else []
        if self.th.window > 0:
            drift = check_history(stats, self.history.accepted, self.th, self.names)
            if drift and not out and self._lasting_shift(stats, drift):
                drift = []
            out += drift
        return stats, out

    def _lasting_shift(self, stats: PartitionStats, anomalies: list[Anomaly]) -> bool:
        """True (and the window replaced, ``GateHistory.adapt``) when ``stats`` breaks only
        drift bounds (``partition_stats.DRIFT_CHECKS``), and so did each of the last
        ``adapt_after - 1`` partitions, all quarantined one after the other since the last
        accepted one, and ``stats`` is within every bound against them: the data moved
        and stayed (a new source, a new feature mix), rather than one partition broke.
        Logged and counted (``elastic_ctr_trainer_gate_adaptations_total``)."""
        from runtime.metrics.trainer import metrics

        n = self.th.adapt_after - 1
        if self.th.adapt_after <= 0 or any(a.check not in ps.DRIFT_CHECKS for a in anomalies):
            return False
        last = max((s.hour for s in self.history.accepted), default="")
        run = [q for q in self.history.quarantined if q.hour > last][-n:] if n > 0 else []
        if len(run) < n or any(q.stats is None or any(a.check not in ps.DRIFT_CHECKS for a in q.anomalies)
                               for q in run):
            return False
        shifted = [q.stats for q in run]
        against = replace(self.th, min_history=1)
        if shifted and check_history(stats, shifted, against, self.names):
            return False
        self.history.adapt(stats, shifted, self.th.window)
        self.history.save(self.state_dir)
        metrics().gate_adaptations.inc()
        log.warning("data gate: partition %s and the %d quarantined before it (%s) agree with each other but not "
                    "with the window: a lasting shift, taken as the new normal (%s)", stats.hour, len(shifted),
                    ", ".join(s.hour for s in shifted) or "none", "; ".join(a.message for a in anomalies))
        return True

    def accept(self, stats: PartitionStats, feasigns: np.ndarray) -> None:
        """Adds an accepted partition to the window (history file and feasign sketch)."""
        if self.th.window > 0:
            self.history.accept(stats, self.th.window)
            self.history.save(self.state_dir)
            self.sketch.add(present_keys(feasigns, self.slots))

    def quarantine(self, hour: str, location: str, stats: Optional[PartitionStats],
                   anomalies: list[Anomaly]) -> None:
        """Records a refused partition (module docstring): the history, the marker beside
        its ``_SUCCESS`` (a marker that cannot be written is logged, the job goes on), the
        metric and one log line per anomaly."""
        from runtime import storage
        from runtime.metrics.trainer import metrics

        for a in anomalies:
            log.warning("data gate: partition %s quarantined: %s: %s", hour, a.check, a.message)
        self.history.quarantine(hour, anomalies, stats)
        self.history.save(self.state_dir)
        try:
            ps.write_marker(location, hour, anomalies, stats, token=self.token)
        except (storage.LocationError, OSError) as exc:
            log.warning("data gate: partition %s: cannot write %s (%s); it is quarantined all the same", hour,
                        ps.marker_location(location), exc)
        metrics().quarantined.inc()


@dataclass
class Verdict:
    """What ``admit`` decided for one partition on every worker: ``loaded`` (``(dataset,
    staged)`` to train, or None: quarantined, nothing loaded is kept) and, on trainer 0,
    the ``anomalies`` (messages) and the ``seconds`` the gate took."""

    loaded: Optional[tuple] = None
    anomalies: Optional[list[str]] = None
    seconds: float = 0.0


def admit(worker, gate: Optional[DataGate], cfg, hour: str, location: str, files: list[str],
          score: Callable[[object], tuple[Optional[float], Optional[float]]]) -> Verdict:
    """Every worker of the job: loads the partition and follows trainer 0's gate (its
    ``gate``; ``None`` elsewhere). A partition with a ``_QUARANTINED`` marker is passed
    over unread; one with more malformed lines than the budget, or whose statistics break
    a bound, is released and quarantined (the bad-line budget and the fed feasigns are
    restored). ``score(staged)``: trainer 0's ``(auc, logloss)`` of the served model on
    the staged rows (None, None before any model). With the gate off (``active``) it only
    loads (a malformed partition raises ``readers.TooManyBadLines`` as before)."""
    from runtime.trainer import fedrows, readers

    # rows set aside for the versions' evaluation (runtime.trainer.model_eval), trainer 0's only
    aside = {"holdout_every": cfg.gate_eval_every} if worker.chief and cfg.gate_eval_every else {}
    if not active(cfg):
        return Verdict(loaded=worker.load(files, keep_rows=worker.chief, **aside))
    marked = fedrows.agree(worker, int(worker.chief and ps.is_quarantined(location)))
    if marked:
        msg = [f"{ps.QUARANTINE_MARKER} marker found in {location}"]
        log.info("%s: partition %s: %s, not trained", worker.who, hour, msg[0])
        return Verdict(anomalies=msg if worker.chief else None)
    budget = worker.budget
    saved = (getattr(budget, "bad", 0), getattr(budget, "seen", 0), getattr(worker, "keys_seen", None))
    loaded, bad = None, None
    try:
        loaded = worker.load(files, keep_rows=worker.chief, **aside)
    except readers.TooManyBadLines as exc:
        bad = str(exc)
    any_bad = fedrows.total(worker, int(bad is not None))
    stats, anomalies, t0 = None, [], time.monotonic()
    if worker.chief:
        if any_bad:
            anomalies = [Anomaly(check="malformed_lines", bound="the bad-line budget", message=bad or
                                 "another trainer's shard has more malformed lines than the budget allows")]
        elif loaded[1].holdout is not None:  # the rows trainer 0 keeps (a stand-in worker may not)
            hold = loaded[1].holdout
            auc, loss = score(loaded[1])  # the job's own next-hour evaluation: not the gate's cost
            t0 = time.monotonic()
            stats, anomalies = gate.judge(hour, hold.labels, hold.dense, hold.feasigns, auc, loss)
            stats.bad_lines = getattr(budget, "bad", 0) - saved[0]
    seconds = time.monotonic() - t0
    refused = fedrows.agree(worker, int(bool(anomalies)))
    if not refused:
        if stats is not None:
            t1 = time.monotonic()
            gate.accept(stats, loaded[1].holdout.feasigns)
            seconds += time.monotonic() - t1
        return Verdict(loaded=loaded, seconds=seconds)
    if loaded is not None:
        loaded[0].release_memory()
    if hasattr(budget, "bad"):
        budget.bad, budget.seen = saved[0], saved[1]
    if saved[2] is not None:
        worker.keys_seen = saved[2]
    if worker.chief:
        gate.quarantine(hour, location, stats, anomalies)
    return Verdict(anomalies=[a.message for a in anomalies] if worker.chief else None, seconds=seconds)
