"""The transfer's model gate: a version is rolled out only if it is not worse than the
version before it beyond the thresholds, as TFX's Evaluator "blesses" a model against the
baseline.

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

A version without an evaluation or without a baseline (the first), evaluated on fewer
than ``min_rows`` rows, or whose ``model_meta.json`` cannot be read (the build refuses it
then), is not held here. The evaluation's rows are a rolling window of the rows set aside
from the newest partitions (``runtime.trainer.model_eval``), so that versions of 1-minute
partitions, a few hundred rows set aside each, are judged too.

**A held chain** is judged against the last version that passed. The trainer's model is not
rolled back when a version is held: the next versions are trained on from the held one,
and the baseline of each is the version just before it, held or not. So while the
version before is held, a version is also compared with the figures the first held
version of the chain was compared with (its baseline: the last version that passed, on
the rows then in the window; ``ModelGate.held``), and held when worse than those beyond
the same thresholds: a model broken for many versions (a bad minute of data it keeps
learning from) stays held until it is back within the bounds of the last one that
passed, instead of passing as soon as it is no worse than its held predecessor. Those
figures are on other rows (the window has moved on): the bounds hold across a few
partitions of drift, as the data gate's AUC bound does across hours.

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

``evaluation`` reads, ``reasons`` compares; ``ModelGate`` keeps each version's verdict (a
file does not change once published, and versions are judged in order) and counts each
held version once; a restarted transfer judges the unserved versions again, in order, to
the same verdicts.
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


def reasons(ev: version_eval.VersionEvaluation, th: Thresholds,
            against: Optional[version_eval.Figures] = None,
            what: str = "the previous version's") -> list[str]:
    """Why ``ev``'s candidate is worse than ``against`` (default: its baseline) beyond
    ``th`` (empty: it passes, there is nothing to compare with, or it was evaluated on
    fewer than ``th.min_rows`` rows). ``what`` names ``against`` in the reasons."""
    c, b = ev.candidate, against if against is not None else ev.baseline
    if b is None or not th.enabled or ev.rows < th.min_rows:
        return []
    out = []
    if c.auc is not None and b.auc is not None and c.auc < b.auc - th.auc_drop:
        out.append(f"AUC {c.auc:.4f} < {what} {b.auc:.4f} - {th.auc_drop:g}")
    if c.logloss > b.logloss * th.logloss_ratio:
        out.append(f"log loss {c.logloss:.4f} > {what} {b.logloss:.4f} x {th.logloss_ratio:g}")

    def off(cal: Optional[float]) -> bool:
        return cal is not None and not 1 / th.calibration <= cal <= th.calibration

    if off(c.calibration) and not off(b.calibration):
        out.append(f"calibration {c.calibration:.3f} outside [{1 / th.calibration:.3f}, {th.calibration:g}] "
                   f"({what} {b.calibration:.3f})")
    return out


def evaluation(root: str, rec: DonefileRecord) -> Optional[version_eval.VersionEvaluation]:
    """Version ``rec``'s evaluation (its ``model_meta.json`` under ``root``); None when it
    has none or its metadata cannot be read (logged)."""
    if not rec.model:
        return None
    import json

    from runtime.formats import model_meta

    loc = storage.join(root, rec.model, model_meta.FILE)
    try:
        meta = json.loads(storage.read_bytes(loc))
        return version_eval.from_metrics(meta.get("metrics") or {}, loc)
    except (storage.LocationError, ValueError) as exc:
        log.warning("model gate: version %d: %s is unreadable (%s); not judged", rec.id, loc, exc)
        return None


def judge(root: str, rec: DonefileRecord, th: Thresholds) -> list[str]:
    """The reasons to hold version ``rec`` against its own baseline (``evaluation``,
    ``reasons``); empty when it passes, has no evaluation, or its metadata cannot be read."""
    ev = evaluation(root, rec) if th.enabled else None
    return reasons(ev, th) if ev is not None else []


@dataclass
class ModelGate:
    """The verdicts of one transfer (module docstring). ``on_held(rec, reasons)`` is called
    once per held version (the transfer records it)."""

    root: str
    th: Thresholds = field(default_factory=Thresholds)
    on_held: Optional[Callable[[DonefileRecord, list[str]], None]] = None
    verdicts: dict[int, list[str]] = field(default_factory=dict)
    #: held version -> (the first held version of its chain, the figures the chain is
    #: judged against: that version's baseline; module docstring)
    references: dict[int, tuple[int, version_eval.Figures]] = field(default_factory=dict)

    def held(self, rec: DonefileRecord) -> bool:
        """True when version ``rec`` is held (judged once, then remembered): worse than its
        baseline, or, while the version judged before it (the newest judged with a lower
        id) is held, worse than that held chain's reference."""
        if rec.id not in self.verdicts:
            ev = evaluation(self.root, rec) if self.th.enabled else None
            why = reasons(ev, self.th) if ev is not None else []
            prev = max((k for k in self.verdicts if k < rec.id), default=None)
            ref = self.references.get(prev) if prev is not None and self.verdicts[prev] else None
            if ev is not None and ref is not None:
                why += [f"{r} (held since version {ref[0]})"
                        for r in reasons(ev, self.th, ref[1], "the last passed version's")]
            self.verdicts[rec.id] = why
            if why:  # held: against its baseline (then it starts the chain) or the chain's reference
                self.references[rec.id] = ref if ref is not None else (rec.id, ev.baseline)
                log.warning("model gate: version %d held: %s", rec.id, "; ".join(why))
                if self.on_held is not None:
                    self.on_held(rec, why)
        return bool(self.verdicts[rec.id])
