"""The data gate's records (``runtime.trainer.data_gate``): a partition's statistics, the
anomalies found in it, the gate's history file and the quarantine marker.

* ``PartitionStats``: what the gate measures on a landed partition (trainer 0's shard of
  its lines): ``rows``; ``click_rate`` (mean label); ``missing_rate`` per slot (float[S],
  the fraction of rows whose slot holds the slot's missing feasign,
  ``runtime.formats.features.missing_feasign``); ``dense_hist`` per dense feature
  (float[13][DENSE_BINS], the fractions of the normalized values in ``DENSE_BINS`` equal
  bins of [0, 1], the last bin closed); ``dense_saturated`` per dense feature (the
  fraction at the normalization's clip bound, value 1.0); ``new_feasign_rate`` (the
  fraction of non-missing feasign occurrences not seen in the recent partitions; None
  while that window is not full); ``auc``/``logloss`` of the served model on the
  partition's rows before training on them (None before any model); ``bad_lines``;
  ``categorical_rows``, ``top_values`` and ``distinct`` (``categorical``): the rows read
  for the categorical statistics (at most ``CATEGORICAL_ROWS``, evenly spread over the
  shard), and per slot its ``TOP_VALUES`` most frequent present feasigns with their
  frequency among the slot's present values (``[[feasign, fraction], ...]``, most frequent
  first) and its distinct present values in those rows (empty lists: not measured).
* ``Anomaly``: one broken bound: ``check`` (a ``CHECKS`` name), ``feature`` (e.g. ``C3``,
  ``I5``, or empty), ``value``, ``bound`` (what was allowed, in words) and ``message``.
* ``GateHistory``: ``--state-dir/data-gate.json``: the statistics of the last accepted
  partitions (``accepted``, at most the gate's window), every quarantined partition
  (``quarantined``: hour, anomalies, unix time, statistics) and every lasting shift taken
  as the new normal (``adaptations``). Written atomically by trainer 0.
* The quarantine marker ``_QUARANTINED``: a JSON object ``{"hour", "anomalies": [...],
  "stats": {...}, "at": unix s}`` written beside the partition's ``_SUCCESS``. A partition
  with the marker is never trained (an operator may also write one by hand: any JSON
  object, or an empty file); deleting it lets the gate judge the partition again.

The distances follow TensorFlow Data Validation's drift comparators: the Jensen-Shannon
distance (square root of the base-2 JS divergence, in [0, 1]) for numeric histograms, the
L-infinity distance (the largest difference of one value's frequency, in [0, 1]) for
categorical features (``linf_distance``).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runtime import storage, storage_write
from runtime.formats.statefile import write_atomically

log = logging.getLogger(__name__)

HISTORY_FILE = "data-gate.json"
QUARANTINE_MARKER = "_QUARANTINED"
DENSE_BINS = 10
#: the checks against recent partitions' statistics: a lasting shift of the data breaks only
#: these, and may be taken as the new normal (``runtime.trainer.data_gate``); the schema's,
#: the malformed-line budget's and the served model's (auc, logloss) never are
DRIFT_CHECKS = ("rows", "click_rate", "missing_rate", "dense_drift", "categorical_drift", "new_feasigns")
#: the checks an ``Anomaly`` may name (``distinct_values``: a slot that lost most of its
#: values, e.g. a join fallen back to a default, is broken data, never a new normal)
CHECKS = ("malformed_lines", "schema_click_rate", "schema_missing", "schema_dense_mean", "schema_saturated", "rows",
          "click_rate", "missing_rate", "dense_drift", "categorical_drift", "distinct_values", "new_feasigns", "auc",
          "logloss")
#: the most frequent present values kept per slot (``top_values``)
TOP_VALUES = 20
#: the rows of the shard the categorical statistics read at most (evenly spread)
CATEGORICAL_ROWS = 20_000


class PartitionStats(BaseModel):
    """A partition's statistics (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    hour: str
    rows: int
    click_rate: float
    missing_rate: list[float]
    dense_hist: list[list[float]]
    dense_saturated: list[float]
    new_feasign_rate: Optional[float] = None
    auc: Optional[float] = None
    logloss: Optional[float] = None
    bad_lines: int = 0
    categorical_rows: int = 0
    top_values: list[list[tuple[int, float]]] = Field(default_factory=list)
    distinct: list[int] = Field(default_factory=list)


class Anomaly(BaseModel):
    """One bound a partition broke (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    check: str
    feature: str = ""
    value: Optional[float] = None
    bound: str
    message: str

    def __str__(self) -> str:
        return self.message


class QuarantineEntry(BaseModel):
    """A quarantined partition in the history: its hour, anomalies, when (unix s) and its
    statistics (None: not measured, e.g. malformed lines or a marker written by hand)."""

    model_config = ConfigDict(extra="forbid")

    hour: str
    anomalies: list[Anomaly]
    at: int
    stats: Optional[PartitionStats] = None


class Adaptation(BaseModel):
    """A lasting shift the gate took as the new normal (``DataGate.judge``): the partition
    that was accepted (``hour``), the quarantined partitions that became the window with
    it (``partitions``) and when (unix s)."""

    model_config = ConfigDict(extra="forbid")

    hour: str
    partitions: list[str]
    at: int


class GateHistory(BaseModel):
    """``--state-dir/data-gate.json`` (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    accepted: list[PartitionStats] = Field(default_factory=list)
    quarantined: list[QuarantineEntry] = Field(default_factory=list)
    adaptations: list[Adaptation] = Field(default_factory=list)

    @classmethod
    def load(cls, state_dir: str) -> "GateHistory":
        """The history in ``state_dir`` (an empty one when there is none). Raises
        ``ValueError`` naming the file when it is not a valid history."""
        path = os.path.join(state_dir, HISTORY_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return cls()
        try:
            return cls.model_validate_json(raw)
        except ValueError as exc:
            raise ValueError(f"{path}: not a valid data-gate history ({exc})") from None

    def save(self, state_dir: str) -> None:
        """Writes the history atomically (temporary file, fsync, rename)."""
        write_atomically(os.path.join(state_dir, HISTORY_FILE), self.model_dump_json())

    def accept(self, stats: PartitionStats, window: int) -> None:
        """Appends an accepted partition's statistics, keeping the last ``window``."""
        kept = [s for s in self.accepted if s.hour != stats.hour] + [stats]
        self.accepted = kept[-max(window, 1):]

    def quarantine(self, hour: str, anomalies: list[Anomaly], stats: Optional[PartitionStats] = None) -> None:
        """Records a quarantined partition (replacing an earlier entry of the same hour)."""
        self.quarantined = [q for q in self.quarantined if q.hour != hour]
        self.quarantined.append(QuarantineEntry(hour=hour, anomalies=anomalies, at=int(time.time()), stats=stats))

    def adapt(self, stats: PartitionStats, shifted: list[PartitionStats], window: int) -> None:
        """Takes a lasting shift as the new normal: the window becomes the ``shifted``
        quarantined partitions' statistics and ``stats`` (the last ``window`` of them);
        recorded in ``adaptations``."""
        self.accepted = (list(shifted) + [stats])[-max(window, 1):]
        self.adaptations.append(Adaptation(hour=stats.hour, partitions=[s.hour for s in shifted],
                                           at=int(time.time())))


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance (base 2, in [0, 1]) of two histograms ``float[k]`` (each
    normalized to sum 1 here; an empty one counts as uniform)."""
    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    p = p / p.sum() if p.sum() > 0 else np.full(len(p), 1.0 / len(p))
    q = q / q.sum() if q.sum() > 0 else np.full(len(q), 1.0 / len(q))
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return float(np.sqrt(max(0.0, 0.5 * kl(p) + 0.5 * kl(q))))


def categorical(feasigns: np.ndarray, missing: np.ndarray, k: int = TOP_VALUES,
                rows: int = CATEGORICAL_ROWS) -> tuple[int, list[list[tuple[int, float]]], list[int]]:
    """The categorical statistics of ``feasigns`` uint64[n, S] (``missing`` uint64[S]: each
    slot's missing feasign, left out): ``(m, top, distinct)`` over ``m`` = min(n, ``rows``)
    rows evenly spread over the n; ``top[s]``: slot s's ``k`` most frequent present
    feasigns as ``(feasign, fraction of the slot's present values)``, most frequent first
    (ties by feasign); ``distinct[s]``: its distinct present feasigns. One sort of the
    S x m values, then run lengths: no Python loop over rows or values."""
    n, S = feasigns.shape
    if n > rows:
        feasigns = feasigns[np.linspace(0, n - 1, rows).astype(np.int64)]
    m = len(feasigns)
    if m == 0:
        return 0, [[] for _ in range(S)], [0] * S
    cols = np.sort(feasigns.T, axis=1)  # S x m, each slot's values in order
    first = np.ones((S, m), bool)
    first[:, 1:] = cols[:, 1:] != cols[:, :-1]
    starts = np.flatnonzero(first.ravel())  # the start of each run of one value
    counts = np.diff(np.append(starts, S * m))
    slot = starts // m
    values = cols.ravel()[starts]
    keep = values != np.asarray(missing, np.uint64)[slot]
    slot, values, counts = slot[keep], values[keep], counts[keep]
    distinct = np.bincount(slot, minlength=S)
    present = np.bincount(slot, weights=counts, minlength=S)
    # by slot, then the most frequent first (stable: ties by value, as sorted)
    order = np.argsort(slot * (m + 1) + (m - counts), kind="stable")
    slot, values, counts = slot[order], values[order], counts[order]
    rank = np.arange(len(slot)) - (np.cumsum(distinct) - distinct)[slot]
    first_k = rank < k
    slot, values = slot[first_k], values[first_k]
    frac = np.round(counts[first_k] / present[slot], 6)
    top = [[] for _ in range(S)]
    for s, v, f in zip(slot.tolist(), values.tolist(), frac.tolist()):
        top[s].append((v, f))
    return m, top, [int(d) for d in distinct]


def linf_distance(p: list[tuple[int, float]], recent: list[list[tuple[int, float]]]) -> float:
    """L-infinity distance (in [0, 1]) of one slot's top values ``p`` (``[(feasign,
    fraction)]``, ``categorical``) from the recent partitions' top values: the largest
    difference between a value's fraction and its median over ``recent`` (0 where a
    partition's top values lack it), over every value of either. TensorFlow Data
    Validation's categorical drift comparator, on the top values only."""
    if not recent:
        return 0.0
    index: dict[int, int] = {}
    for top in [p, *recent]:
        for v, _ in top:
            index.setdefault(v, len(index))
    table = np.zeros((len(recent), len(index)))
    for i, top in enumerate(recent):
        for v, f in top:
            table[i, index[v]] = f
    mine = np.zeros(len(index))
    for v, f in p:
        mine[index[v]] = f
    return float(np.max(np.abs(mine - np.median(table, axis=0)), initial=0.0))


def marker_location(partition: str) -> str:
    """``<partition>/_QUARANTINED`` (path or URL)."""
    return storage.join(partition, QUARANTINE_MARKER)


def is_quarantined(partition: str) -> bool:
    """True when the partition at ``partition`` carries the quarantine marker."""
    return storage.exists(marker_location(partition))


def read_marker(partition: str) -> dict[str, Any]:
    """The marker's JSON object (``{}`` for an empty marker written by hand). Raises
    ``storage.LocationError`` when there is none, ``ValueError`` naming it when it holds
    something else than a JSON object."""
    loc = marker_location(partition)
    raw = storage.read_bytes(loc)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{loc}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{loc}: expected a JSON object")
    return data


def write_marker(partition: str, hour: str, anomalies: list[Anomaly], stats: Optional[PartitionStats],
                 token: Optional[str] = None) -> None:
    """Writes the quarantine marker beside the partition's ``_SUCCESS`` (a local path:
    temporary file then rename; a URL or store: ``storage_write.upload``). Raises
    ``storage.LocationError`` when it cannot be written."""
    body = {"hour": hour, "anomalies": [a.model_dump() for a in anomalies],
            "stats": stats.model_dump() if stats is not None else None, "at": int(time.time())}
    fd, tmp = tempfile.mkstemp(prefix=".quarantined-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1)
        storage_write.upload(tmp, marker_location(partition), token=token)
    finally:
        os.unlink(tmp)
