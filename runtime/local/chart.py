"""The freshness and AUC chart drawn from a Prometheus' query API (``query_range``), a PNG
with matplotlib's Agg backend (no display; matplotlib comes with the ``tracking-server``
extra, which ``make install`` installs).

Top: the served data's age (``SERIES["age"]``: now - the end of the last partition the
served version was trained through, hours) with the freshness SLO. Bottom: the AUC per
partition (the trainer's next-hour AUC before training on it, and over each pass). The
same expressions as the overview dashboard's panels.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

#: the series drawn: name -> PromQL
SERIES = {
    "age": "time() - min(elastic_ctr_serving_model_data_end_timestamp_seconds)",
    "auc_before": 'max(elastic_ctr_trainer_auc{stage="before_training"})',
    "auc_train": 'avg(elastic_ctr_trainer_auc{stage="training"})',
}
CHART = "freshness-auc.png"


def fetch(server, start: float, end: float, step_s: float = 1.0) -> dict[str, list[tuple[float, float]]]:
    """``{name: [(unix s, value), ...]}`` of ``SERIES`` over ``[start, end]`` from
    ``server`` (a ``runtime.local.prometheus_server.PrometheusServer``), every ``step_s`` (the
    scrape interval: a trainer's last values may be scraped once before it exits); NaN
    points left out."""
    out = {}
    for name, expr in SERIES.items():
        res = server.query_range(expr, start, end, step_s)
        pts = [(float(t), float(v)) for r in res[:1] for t, v in r["values"]]
        out[name] = [(t, v) for t, v in pts if v == v]
    return out


def write_chart(path: str | Path, series: dict[str, list[tuple[float, float]]], slo_s: Optional[float] = None,
                start: Optional[float] = None,
                title: str = "elastic-ctr: served data age and AUC (from Prometheus)") -> Path:
    """Draws ``series`` (``fetch``'s) into the PNG ``path``; ``slo_s``: the freshness SLO
    line (seconds); ``start``: the x axis' origin (unix s; default the first point).
    Returns the path. Raises ``ValueError`` when a series is missing."""
    missing = [k for k in SERIES if k not in series]
    if missing:
        raise ValueError(f"write_chart: series {missing} missing")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = start if start is not None else min((p[0] for pts in series.values() for p in pts), default=0.0)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)

    def xy(name, scale=1.0):
        pts = series[name]
        return [(t - t0) / 60 for t, _ in pts], [v * scale for _, v in pts]

    ax.plot(*xy("age", 1 / 3600), "-", label="served data age (now - data end of the served version)")
    if slo_s is not None:
        ax.axhline(slo_s / 3600, color="tab:red", ls="--", label=f"freshness SLO ({slo_s / 3600:g} h)")
    ax.set_ylabel("hours")
    ax.legend(loc="upper left", fontsize=8)
    bx.plot(*xy("auc_before"), "o-", ms=3, label="next-hour AUC before training (trainer 0)")
    bx.plot(*xy("auc_train"), "s--", ms=3, label="AUC over the training pass (trainers' mean)")
    bx.set_ylabel("AUC")
    bx.set_xlabel("minutes since the run started")
    bx.legend(loc="lower right", fontsize=8)
    for a in (ax, bx):
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
