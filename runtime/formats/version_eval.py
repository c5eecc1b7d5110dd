"""A version's evaluation on rows it was not trained on, beside the served version's on the
same rows: the model gate's input (``runtime.cube.transfer.model_gate``).

Trainer 0 of a continuous job sets aside every ``--gate-eval-every``-th row of its shard of
each partition (never trained: ``runtime.trainer.dataset.stage``) into a rolling window of
the newest partitions' rows (at least ``--gate-eval-rows``: ``runtime.trainer.model_eval``);
at an export point it scores the window with the model being exported (``candidate``)
beside the previous export (``baseline``: the version the transfer serves unless it held
it) on the same rows: those the previous export predicted. The record goes into
``model_meta.json`` as ``metrics.evaluation`` (``runtime.formats.model_meta``; ``KEY``)::

    {"hour": "20261120/0705", "first_hour": "20261120/0701", "partitions": 5, "rows": 2100,
     "candidate": {"auc": 0.781, "logloss": 0.47, "calibration": 1.02},
     "baseline":  {"auc": 0.774, "logloss": 0.48, "calibration": 0.97}}

``hour`` and ``first_hour``: the newest and the oldest partition the compared rows were
set aside from, ``partitions`` how many (a record without them: ``hour``'s rows only);
``calibration`` = mean prediction / click rate of the rows (None without a click); ``auc``
None for rows of one class; ``baseline`` None for the first version (no earlier model).
A version without the record (a batch job, a version republished after a restart) carries
no evaluation.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

KEY = "evaluation"


class EvaluationError(ValueError):
    """A ``metrics.evaluation`` record that is not what ``VersionEvaluation`` writes."""


class Figures(BaseModel):
    """One model's figures on the rows: AUC, mean log loss, calibration."""

    model_config = ConfigDict(extra="forbid")

    auc: Optional[float] = None
    logloss: float
    calibration: Optional[float] = None


class VersionEvaluation(BaseModel):
    """The record (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    hour: str
    rows: int
    first_hour: Optional[str] = None
    partitions: int = 1
    candidate: Figures
    baseline: Optional[Figures] = None


def figures(labels: np.ndarray, p: np.ndarray) -> Figures:
    """Figures of probabilities ``p`` float[n] for ``labels`` {0,1}[n] (n >= 1)."""
    from runtime.evaluation import auc

    y = np.asarray(labels, np.float64)
    q = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    loss = float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))
    a = auc(y, q) if 0 < y.sum() < len(y) else None
    cal = float(q.mean() / y.mean()) if y.sum() > 0 else None
    r = lambda v: None if v is None else round(float(v), 6)  # noqa: E731
    return Figures(auc=r(a), logloss=round(loss, 6), calibration=r(cal))


def from_metrics(metrics: Mapping[str, Any], where: str) -> Optional[VersionEvaluation]:
    """The evaluation in a ``model_meta.json``'s ``metrics`` (None when it has none).
    Raises ``EvaluationError`` naming ``where`` for a malformed record."""
    raw = metrics.get(KEY) if isinstance(metrics, Mapping) else None
    if raw is None:
        return None
    try:
        return VersionEvaluation.model_validate(raw)
    except ValidationError as exc:
        raise EvaluationError(f"{where}: metrics.{KEY}: {exc.errors()[0]['msg']}") from None
