"""Trainer 0's evaluation of each exported version on rows it was not trained on, beside the
previous export's on the same rows (``runtime.formats.version_eval``; the model gate of the
cube transfer reads it)."""
from __future__ import annotations

import logging
from typing import Optional

from runtime.formats import version_eval

log = logging.getLogger(__name__)


class Collector:
    """The rows set aside from the first partition trained since the last export point
    (``rows_max`` at most) and the model's figures on them before that partition was
    trained (``before``); ``finish`` scores the model being exported on them."""

    def __init__(self, rows_max: int = 20_000):
        self.rows_max = rows_max
        self.batch = None
        self.hour: Optional[str] = None
        self.baseline: Optional[version_eval.Figures] = None

    def before(self, worker, staged, hour: str, scored: bool) -> None:
        """Before training ``hour`` (its ``staged`` rows): keeps its rows set aside when none
        are kept yet, with the current model's figures on them when there is a model."""
        from runtime.trainer import readers

        ev = getattr(staged, "evaluation", None)
        if self.batch is not None or ev is None or len(ev) == 0:
            return
        n = min(len(ev), self.rows_max)
        self.batch = readers.Batch(ev.labels[:n], ev.dense[:n], ev.feasigns[:n])
        self.hour = hour
        self.baseline = version_eval.figures(self.batch.labels, worker.predict(self.batch)) if scored else None

    def finish(self, worker) -> Optional[dict]:
        """The export's evaluation record (JSON-ready), or None without rows; starts over."""
        if self.batch is None:
            return None
        cand = version_eval.figures(self.batch.labels, worker.predict(self.batch))
        rec = version_eval.VersionEvaluation(hour=self.hour, rows=len(self.batch), candidate=cand,
                                             baseline=self.baseline)
        log.info("%s: version evaluation on %d rows of %s set aside: candidate %s, previous export %s", worker.who,
                 rec.rows, rec.hour, cand.model_dump(), self.baseline.model_dump() if self.baseline else None)
        self.batch, self.hour, self.baseline = None, None, None
        return rec.model_dump()
