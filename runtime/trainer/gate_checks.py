"""The data gate's checks: a partition's statistics against its schema (``check_schema``) and against the recent accepted partitions (``check_history``, within ``Thresholds``).

``runtime.trainer.data_gate`` measures the partitions and keeps the window; the module
docstring there lists what each check compares. Every check returns the anomalies found
(``runtime.formats.partition_stats.Anomaly``), none when the partition passes.
"""
from __future__ import annotations

import statistics as pystats
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from runtime.formats import data_schema, partition_stats as ps
from runtime.formats.partition_stats import Anomaly, PartitionStats

#: a slot with fewer present values among the rows read is not compared by value (its
#: frequencies are noise): the missing-rate bound speaks for it
MIN_PRESENT = 100


@dataclass(frozen=True)
class Thresholds:
    """The gate's bounds (``runtime.trainer.gate_config``; each as its flag describes)."""

    window: int = 6
    min_history: int = 3
    rows_ratio: float = 4.0
    click_ratio: float = 1.5
    missing_shift: float = 0.2
    dense_js: float = 0.25
    new_feasign_shift: float = 0.3
    auc_drop: float = 0.05
    logloss_ratio: float = 1.3
    adapt_after: int = 6
    categorical_linf: float = 0.5
    distinct_ratio: float = 3.0

    @classmethod
    def of(cls, cfg) -> "Thresholds":
        """The bounds of a ``TrainConfig``."""
        return cls(cfg.gate_window, cfg.gate_min_history, cfg.gate_rows_ratio, cfg.gate_click_ratio,
                   cfg.gate_missing_shift, cfg.gate_dense_js, cfg.gate_new_feasign_shift, cfg.gate_auc_drop,
                   cfg.gate_logloss_ratio, cfg.gate_adapt_after, cfg.gate_categorical_linf, cfg.gate_distinct_ratio)


def _a(check: str, feature: str, value: float, bound: str, what: str) -> Anomaly:
    return Anomaly(check=check, feature=feature, value=round(float(value), 6), bound=bound,
                   message=f"{what} {value:.4g} {'' if not feature else f'({feature}) '}outside {bound}")


def check_schema(stats: PartitionStats, schema: data_schema.DataSchema) -> list[Anomaly]:
    """The schema bounds ``stats`` breaks (module docstring)."""
    out = []
    lo, hi = schema.label.click_rate
    if not lo <= stats.click_rate <= hi:
        out.append(_a("schema_click_rate", "label", stats.click_rate, f"[{lo}, {hi}] (schema)", "click rate"))
    for spec, rate in zip(schema.sparse, stats.missing_rate):
        if rate > spec.max_missing:
            out.append(_a("schema_missing", spec.name, rate, f"<= {spec.max_missing} (schema)", "missing rate"))
    centers = (np.arange(ps.DENSE_BINS) + 0.5) / ps.DENSE_BINS
    for spec, h, sat in zip(schema.dense, stats.dense_hist, stats.dense_saturated):
        mean = float(np.dot(h, centers))
        if not spec.mean[0] <= mean <= spec.mean[1]:
            out.append(_a("schema_dense_mean", spec.name, mean, f"[{spec.mean[0]}, {spec.mean[1]}] (schema)",
                          "normalized mean"))
        elif sat > spec.max_saturated:
            out.append(_a("schema_saturated", spec.name, sat, f"<= {spec.max_saturated} (schema)",
                          "saturated fraction"))
    return out


def check_history(stats: PartitionStats, recent: Sequence[PartitionStats], th: Thresholds,
                  names: Sequence[str]) -> list[Anomaly]:
    """The bounds ``stats`` breaks against the ``recent`` accepted partitions (module
    docstring; nothing before ``th.min_history`` of them). ``names``: the slots' names."""
    if len(recent) < th.min_history:
        return []
    out = []
    med = pystats.median

    def ratio(check: str, value: float, ref: float, r: float, what: str) -> None:
        lo, hi = ref / r, ref * r
        if ref > 0 and not lo <= value <= hi:
            out.append(_a(check, "", value, f"[{lo:.4g}, {hi:.4g}] (recent median {ref:.4g} /x {r:g})", what))

    ratio("rows", stats.rows, med([s.rows for s in recent]), th.rows_ratio, "rows")
    ratio("click_rate", stats.click_rate, med([s.click_rate for s in recent]), th.click_ratio, "click rate")
    for j, name in enumerate(names):
        ref = med([s.missing_rate[j] for s in recent])
        if abs(stats.missing_rate[j] - ref) > th.missing_shift:
            out.append(_a("missing_rate", name, stats.missing_rate[j],
                          f"{ref:.4g} +- {th.missing_shift:g} (recent median)", "missing rate"))
    for i in range(len(stats.dense_hist)):
        mean_hist = np.mean([s.dense_hist[i] for s in recent], axis=0)
        d = ps.js_distance(np.asarray(stats.dense_hist[i]), mean_hist)
        if d > th.dense_js:
            out.append(_a("dense_drift", f"I{i + 1}", d, f"<= {th.dense_js:g} (Jensen-Shannon distance to the "
                          "recent histogram)", "drift"))
    out += check_categorical(stats, recent, th, names)
    rates = [s.new_feasign_rate for s in recent if s.new_feasign_rate is not None]
    if stats.new_feasign_rate is not None and len(rates) >= th.min_history:
        ref = med(rates)
        if stats.new_feasign_rate > ref + th.new_feasign_shift:
            out.append(_a("new_feasigns", "", stats.new_feasign_rate,
                          f"<= {ref:.4g} + {th.new_feasign_shift:g} (recent median)", "new-feasign rate"))
    aucs = [s.auc for s in recent if s.auc is not None]
    if stats.auc is not None and len(aucs) >= th.min_history and stats.auc < med(aucs) - th.auc_drop:
        out.append(_a("auc", "", stats.auc, f">= {med(aucs):.4g} - {th.auc_drop:g} (recent median)",
                      "served model's AUC"))
    losses = [s.logloss for s in recent if s.logloss is not None]
    if stats.logloss is not None and len(losses) >= th.min_history and stats.logloss > med(losses) * th.logloss_ratio:
        out.append(_a("logloss", "", stats.logloss, f"<= {med(losses):.4g} x {th.logloss_ratio:g} (recent median)",
                      "served model's log loss"))
    return out


def check_categorical(stats: PartitionStats, recent: Sequence[PartitionStats], th: Thresholds,
                      names: Sequence[str]) -> list[Anomaly]:
    """The categorical bounds ``stats`` breaks against the ``recent`` partitions that
    measured them (``th.min_history`` at least): per slot with ``MIN_PRESENT`` present
    values read or more, the L-infinity distance of its top values' frequencies to their
    recent median (``categorical_drift``), and its distinct values fallen below the
    recent median / ``th.distinct_ratio`` both in count and per row read
    (``distinct_values``: a partition with fewer rows has fewer distinct values of a big
    slot, not fewer per row; one with more rows has fewer per row of a small slot, not
    fewer in count)."""
    recent = [s for s in recent if s.top_values and s.categorical_rows]
    if not stats.top_values or not stats.categorical_rows or len(recent) < th.min_history:
        return []
    out, med, m = [], pystats.median, stats.categorical_rows
    for j, name in enumerate(names):
        if m * (1 - stats.missing_rate[j]) < MIN_PRESENT:
            continue
        d = ps.linf_distance(stats.top_values[j], [s.top_values[j] for s in recent])
        if d > th.categorical_linf:
            out.append(_a("categorical_drift", name, d, f"<= {th.categorical_linf:g} (L-infinity distance of the "
                          "top values' frequencies to the recent median)", "categorical drift"))
        ref = med([s.distinct[j] for s in recent])
        per_row = med([s.distinct[j] / s.categorical_rows for s in recent])
        got = stats.distinct[j]
        if got < ref / th.distinct_ratio and got / m < per_row / th.distinct_ratio:
            out.append(_a("distinct_values", name, got, f">= {ref:.4g} / {th.distinct_ratio:g} (recent median; "
                          f"{per_row:.3g} per row / {th.distinct_ratio:g})", "distinct values"))
    return out
