"""The transfer's model gate: a version is rolled out only if it is not worse than the
version before it beyond the thresholds, as TFX's Evaluator "blesses" a model against the
baseline (issue 37).

Each version of a continuous job carries its evaluation on rows it was not trained on,
beside the previous export's on the same rows (``runtime.formats.version_eval``, in its
``model_meta.json``). A version is **held** when its candidate figures are worse than the
baseline's by more than the thresholds (``Thresholds``; transfer flags
``--model-gate-auc-drop``, ``--model-gate-logloss-ratio``, ``--model-gate-calibration``,
stack keys ``modelGate*``):

* AUC below the baseline's by more than ``auc_drop``;
* log loss above ``logloss_ratio`` x the baseline's;
* calibration (mean prediction / click rate) off by more than a factor ``calibration``
  (either way) while the baseline's is not.

A version without an evaluation or without a baseline (the first), or whose
``model_meta.json`` cannot be read (the build refuses it then), is not held here.

A held version is never rolled out; it is recorded in the transfer's history (status
``held``, the reasons), ``/dict/info`` (``held``), the MLflow run (tag
``version.<id>.held``) and ``elastic_ctr_transfer_versions_held_total``. The versions after
it are served complete (the planner, ``runtime.cube.transfer.planner``):

* a held **patch**: the next patch of the same base that passes carries the held patches'
  rows too: it is built from their SequenceFiles and its own, in version order, a key's
  last row winning (``Plan.carry``), which is exactly the table the trainer held at its
  export; so no served table ever lacks a held patch's rows;
* a held **base**: its patches cannot be applied without it, so they wait; the served
  chain stays whole on the previous base until a newer base passes.

``judge`` reads and compares; ``ModelGate`` keeps each version's verdict (a file does not
change once published) and counts each held version once.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from runtime import storage
from runtime.formats import version_eval
from runtime.formats.donefile import DonefileRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Thresholds:
    """The model gate's bounds (module docstring); ``enabled`` False: nothing is held."""

    auc_drop: float = 0.05
    logloss_ratio: float = 1.25
    calibration: float = 2.5
    enabled: bool = True
    #: an evaluation on fewer rows is not judged (the version passes): a few hundred rows move
    #: AUC and calibration more than the bounds (the demo's small runs held good versions)
    min_rows: int = 500


def reasons(ev: version_eval.VersionEvaluation, th: Thresholds) -> list[str]:
    """Why ``ev``'s candidate is worse than its baseline beyond ``th`` (empty: it passes,
    has no baseline, or was evaluated on fewer than ``th.min_rows`` rows)."""
    c, b = ev.candidate, ev.baseline
    if b is None or not th.enabled or ev.rows < th.min_rows:
        return []
    out = []
    if c.auc is not None and b.auc is not None and c.auc < b.auc - th.auc_drop:
        out.append(f"AUC {c.auc:.4f} < the previous version's {b.auc:.4f} - {th.auc_drop:g}")
    if c.logloss > b.logloss * th.logloss_ratio:
        out.append(f"log loss {c.logloss:.4f} > the previous version's {b.logloss:.4f} x {th.logloss_ratio:g}")

    def off(cal: Optional[float]) -> bool:
        return cal is not None and not 1 / th.calibration <= cal <= th.calibration

    if off(c.calibration) and not off(b.calibration):
        out.append(f"calibration {c.calibration:.3f} outside [{1 / th.calibration:.3f}, {th.calibration:g}] "
                   f"(previous version {b.calibration:.3f})")
    return out


def judge(root: str, rec: DonefileRecord, th: Thresholds) -> list[str]:
    """The reasons to hold version ``rec`` (its ``model_meta.json`` under ``root``); empty
    when it passes, has no evaluation, or its metadata cannot be read (logged)."""
    if not th.enabled or not rec.model:
        return []
    import json

    from runtime.formats import model_meta

    loc = storage.join(root, rec.model, model_meta.FILE)
    try:
        meta = json.loads(storage.read_bytes(loc))
        ev = version_eval.from_metrics(meta.get("metrics") or {}, loc)
    except (storage.LocationError, ValueError) as exc:
        log.warning("model gate: version %d: %s is unreadable (%s); not judged", rec.id, loc, exc)
        return []
    return reasons(ev, th) if ev is not None else []


@dataclass
class ModelGate:
    """The verdicts of one transfer (module docstring). ``on_held(rec, reasons)`` is called
    once per held version (the transfer records it)."""

    root: str
    th: Thresholds = field(default_factory=Thresholds)
    on_held: Optional[Callable[[DonefileRecord, list[str]], None]] = None
    verdicts: dict[int, list[str]] = field(default_factory=dict)

    def held(self, rec: DonefileRecord) -> bool:
        """True when version ``rec`` is held (judged once, then remembered)."""
        if rec.id not in self.verdicts:
            why = judge(self.root, rec, self.th)
            self.verdicts[rec.id] = why
            if why:
                log.warning("model gate: version %d held: %s", rec.id, "; ".join(why))
                if self.on_held is not None:
                    self.on_held(rec, why)
        return bool(self.verdicts[rec.id])
