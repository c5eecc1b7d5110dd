"""The trainer's machine-readable result lines, one JSON object on one line after a prefix:

* ``ELASTIC_CTR_RESULT {json}``: every trainer process (``elastic-ctr train`` in a PS
  role or ``--single``) prints its own record at the end (``runtime.trainer.train``).
  Read by the local-cluster launcher (``runtime.local.ps``), the container stack
  test (trainer 0's pod log) and the training benchmark.
* ``ELASTIC_CTR_SUMMARY {json}``: ``train --local-cluster`` / ``--single`` prints the job's
  record once it is done (``runtime.trainer.cli``): trainer 0's record plus the launcher's
  totals. Read by the local pipeline (``runtime.local.status``), the benchmark and tests.

Both are ``TrainResult`` records, written with ``TrainResult.format`` and read with
``TrainResult.parse`` / ``TrainResult.find``: a reader accepts exactly what the writer
writes (unknown keys and wrong types are errors). The JSON is ``json`` with ``NaN``
allowed (an AUC over one class). Which fields are set depends on the job (batch or
continuous), the process (trainer 0 or another) and the line (only the summary has the
``*_total`` fields); absent fields are left out of the line, not written as ``null``.
Units: seconds (``*_seconds``), examples per second (``examples_per_s*``).
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

from runtime.formats._validation import validated

#: the prefix of one trainer process's line
RESULT = "ELASTIC_CTR_RESULT"
#: the prefix of the job's line (``--local-cluster`` / ``--single``)
SUMMARY = "ELASTIC_CTR_SUMMARY"
KINDS = (RESULT, SUMMARY)


class TrainResultError(ValueError):
    """A result line is not what ``TrainResult.format`` writes; the message names the line
    kind, what was wrong and (``find``) the source."""


class PartitionResult(BaseModel):
    """One partition of a continuous job: ``hour`` (``YYYYMMDD/HH``), ``rows`` this process
    trained (= examples: one pass), ``seconds`` the pass took (wall, s), ``auc_before``
    (trainer 0: the AUC of the model before training on it; ``None`` for the first),
    ``train_auc`` (over the pass), ``version`` exported right after it, if any;
    ``logloss_before`` (trainer 0: the log loss beside ``auc_before``), ``gate_seconds``
    (trainer 0: the data gate's statistics and checks, s), ``quarantined`` (the data gate's
    anomalies, one message each, when it refused the partition: ``rows`` is then 0, nothing
    was trained; ``runtime.trainer.data_gate``); after a shrink point of the feature
    lifecycle that followed it (trainer 0; ``runtime.trainer.shrink``): ``shrink_seconds``
    (wall, s), ``table_rows`` (the parameter servers' rows after it, admitted or not) and
    ``evicted`` (rows it removed; ``None`` when the rows before it were not known)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    hour: str
    rows: int
    seconds: Optional[float] = None
    auc_before: Optional[float] = None
    train_auc: Optional[float] = None
    version: Optional[int] = None
    logloss_before: Optional[float] = None
    gate_seconds: Optional[float] = None
    quarantined: Optional[list[str]] = None
    shrink_seconds: Optional[float] = None
    table_rows: Optional[int] = None
    evicted: Optional[int] = None


class ExportResult(BaseModel):
    """One version a continuous job exported (``runtime.trainer.online_state.ExportRecord``):
    ``id``, ``kind``, its ``base``, the last ``hour`` in it, sparse ``rows``, ``seconds``
    (export wall time until published, s: cutting the rows and the publication, each also
    given: ``rows_seconds``, ``publish_seconds``), ``checkpoint_seconds`` (the checkpoint
    taken after it was published, s; ``None`` when none was due: ``--checkpoint-every-minutes``),
    ``landed`` (unix s: when trainer 0 found its last partition complete; the donefile
    line's ``landed``), ``deleted`` (rows of zeros among ``rows``: keys the version deletes
    from the served table, ``runtime.trainer.served``)."""

    model_config = ConfigDict(extra="forbid")

    id: int
    kind: Literal["base", "patch"]
    base: int
    hour: str
    rows: int
    seconds: float = 0.0
    rows_seconds: Optional[float] = None
    checkpoint_seconds: Optional[float] = None
    publish_seconds: Optional[float] = None
    landed: Optional[int] = None
    deleted: Optional[int] = None


class TrainResult(BaseModel):
    """One result record (module docstring). Every field but the job's shape is optional.

    Job: ``mode`` (``ps`` | ``single``), ``trainers``, ``pservers``, ``trainer_id`` (PS).
    Training (every trainer): ``examples`` trained, ``rows`` loaded, ``load_seconds``,
    ``train_seconds``, ``examples_per_s``, ``examples_per_s_with_load``; batch jobs also
    ``epochs``, ``threads``, ``train_auc`` (per pass). Trainer 0: ``test_auc`` (batch: per
    pass; continuous: the AUC before each partition), ``version`` (the last exported),
    ``export_seconds`` (batch). Continuous jobs: ``mode_online`` = ``continuous``,
    ``next_hour``, ``partitions``, ``wall_seconds_online``, trainer 0's ``exports``.
    Summary only (the launcher): ``wall_seconds``, ``log_dir``, ``pserver_exit_codes``,
    ``examples_total`` (every trainer's examples), ``examples_per_s_total`` and
    ``examples_per_s_with_load_total`` (over the slowest trainer's seconds).
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    mode: Literal["ps", "single"]
    trainers: int
    pservers: int
    trainer_id: Optional[int] = None
    epochs: Optional[int] = None
    threads: Optional[int] = None
    examples: Optional[int] = None
    rows: Optional[int] = None
    load_seconds: Optional[float] = None
    train_seconds: Optional[float] = None
    examples_per_s: Optional[float] = None
    examples_per_s_with_load: Optional[float] = None
    train_auc: Optional[list[float]] = None
    test_auc: Optional[list[float]] = None
    version: Optional[int] = None
    export_seconds: Optional[float] = None
    mode_online: Optional[Literal["continuous"]] = None
    next_hour: Optional[str] = None
    partitions: Optional[list[PartitionResult]] = None
    wall_seconds_online: Optional[float] = None
    exports: Optional[list[ExportResult]] = None
    wall_seconds: Optional[float] = None
    log_dir: Optional[str] = None
    pserver_exit_codes: Optional[list[Optional[int]]] = None
    examples_total: Optional[int] = None
    examples_per_s_total: Optional[float] = None
    examples_per_s_with_load_total: Optional[float] = None

    @classmethod
    def of(cls, record: dict[str, Any]) -> "TrainResult":
        """The record of a dict with the fields above. Raises ``TrainResultError`` naming
        each wrong field (a writer's bug: the line would not be readable)."""
        return validated(cls, record, TrainResultError, "train result record")

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON values, absent fields left out (what the line holds)."""
        return self.model_dump(mode="json", exclude_none=True)

    def format(self, kind: str = RESULT) -> str:
        """``'<kind> <json>'``, one line (no newline). ``kind``: ``RESULT`` or ``SUMMARY``."""
        if kind not in KINDS:
            raise ValueError(f"train result line kind {kind!r}: expected one of {KINDS}")
        return f"{kind} {self.model_dump_json(exclude_none=True)}"

    @classmethod
    def parse(cls, line: str, kind: str = RESULT) -> "TrainResult":
        """Reads one ``'<kind> <json>'`` line (trailing whitespace ignored). Raises
        ``TrainResultError`` naming the kind and what was wrong: another prefix, JSON that
        does not parse, or fields that are missing, unknown or of the wrong type."""
        head, _, body = line.rstrip("\r\n").partition(" ")
        if head != kind:
            raise TrainResultError(f"{kind} line expected, got {line[:60]!r}")
        try:
            raw = json.loads(body)
        except ValueError as exc:
            raise TrainResultError(f"{kind} line: not JSON ({exc}): {body[:80]!r}") from None
        if not isinstance(raw, dict):
            raise TrainResultError(f"{kind} line: a JSON object expected, got {type(raw).__name__}")
        return validated(cls, raw, TrainResultError, f"{kind} line")

    @classmethod
    def find(cls, text: str, kind: str = RESULT, source: str = "log") -> Optional["TrainResult"]:
        """The last ``kind`` line in ``text`` (a process's log or stdout), or ``None`` if
        there is none. Raises ``TrainResultError`` (naming ``source``) if it is malformed."""
        found = None
        for line in text.splitlines():
            if line.startswith(kind + " "):
                found = line
        if found is None:
            return None
        try:
            return cls.parse(found, kind)
        except TrainResultError as exc:
            raise TrainResultError(f"{source}: {exc}") from None
