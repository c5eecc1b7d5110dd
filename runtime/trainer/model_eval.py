"""Trainer 0's evaluation of each exported version on rows it was not trained on, beside the
previous export's on the same rows (``runtime.formats.version_eval``; the model gate of the
cube transfer reads it).

The rows are a rolling window: the rows set aside from the newest trained partitions that
hold at least ``window_rows`` of them (``--gate-eval-rows``; each partition's first
``rows_max``). At one-minute partitions one partition sets aside a few hundred rows, fewer
than the model gate judges (``--model-gate-min-rows``); the window gathers enough of them.
Every row of the window was set aside, so no model ever trained on it, and each export's
predictions on the window are kept: the next export is compared with them on the same
rows. A partition's rows get the previous export's predictions when they enter the window
before anything was trained since that export (its ``before``: the model is then the
export); the rows of later partitions trained before the same export have none, so that
export is compared on the others only (``rows`` says how many), and they join the
comparison at the next export.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np

from runtime.formats import version_eval

log = logging.getLogger(__name__)

#: the window's rows at least, by default (``--gate-eval-rows``): 4x the model gate's
#: default minimum (500), a few minutes of 1-minute partitions at 1M rows/hour
WINDOW_ROWS = 2000


@dataclass
class _Part:
    """One partition's rows in the window, and the last export's predictions on them
    (``float64[n]``; None: the model had moved past that export when they arrived)."""

    hour: str
    batch: object
    previous: Optional[np.ndarray]


class Collector:
    """The window of rows set aside (module docstring); ``before`` adds a partition's rows
    before it is trained, ``finish`` scores the model being exported on the window."""

    def __init__(self, rows_max: int = 20_000, window_rows: int = WINDOW_ROWS):
        self.rows_max = rows_max
        self.window_rows = window_rows
        self.parts: list[_Part] = []  # oldest first
        self.at_export = True  # nothing trained since the last export (or this job's start)

    def before(self, worker, staged, hour: str, scored: bool) -> None:
        """Before training ``hour`` (its ``staged`` rows): adds its rows set aside to the
        window, with the current model's predictions on them when the model is still the
        last export (or the restored one) and ``scored`` (there is a model); drops the
        oldest partitions the window no longer needs."""
        from runtime.trainer import readers

        ev = getattr(staged, "evaluation", None)
        if ev is not None and len(ev):
            n = min(len(ev), self.rows_max)
            batch = readers.Batch(ev.labels[:n], ev.dense[:n], ev.feasigns[:n])
            prev = np.asarray(worker.predict(batch), np.float64) if self.at_export and scored else None
            self.parts.append(_Part(hour, batch, prev))
            while len(self.parts) > 1 and sum(len(p.batch) for p in self.parts[1:]) >= self.window_rows:
                self.parts.pop(0)
        self.at_export = False

    def finish(self, worker) -> Optional[dict]:
        """The export's evaluation record (JSON-ready; None without rows): the model being
        exported (``candidate``) beside the previous export (``baseline``) on the window's
        rows that export predicted, or the candidate alone on every row when none did (the
        first version). Its predictions become the baseline of the next export."""
        from runtime.trainer import readers

        if not self.parts:
            return None
        batch = readers.Batch(*(np.concatenate([getattr(p.batch, f) for p in self.parts])
                                for f in ("labels", "dense", "feasigns")))
        cand = np.asarray(worker.predict(batch), np.float64)
        known = [p for p in self.parts if p.previous is not None]
        if known:
            mask = np.concatenate([np.full(len(p.batch), p.previous is not None) for p in self.parts])
            prev = np.concatenate([p.previous for p in known])
            labels = batch.labels[mask]
            rec = version_eval.VersionEvaluation(
                hour=known[-1].hour, first_hour=known[0].hour, partitions=len(known), rows=int(mask.sum()),
                candidate=version_eval.figures(labels, cand[mask]), baseline=version_eval.figures(labels, prev))
        else:
            rec = version_eval.VersionEvaluation(hour=self.parts[-1].hour, first_hour=self.parts[0].hour,
                                                 partitions=len(self.parts), rows=len(batch),
                                                 candidate=version_eval.figures(batch.labels, cand))
        start = 0
        for p in self.parts:
            p.previous, start = cand[start:start + len(p.batch)], start + len(p.batch)
        self.at_export = True
        log.info("%s: version evaluation on %d rows set aside from %d partition(s) %s..%s: candidate %s, previous "
                 "export %s", worker.who, rec.rows, rec.partitions, rec.first_hour, rec.hour,
                 rec.candidate.model_dump(), rec.baseline.model_dump() if rec.baseline else None)
        return rec.model_dump()
