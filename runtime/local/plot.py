"""The online demo's chart (``elastic-ctr local``, ``make demo``): one PNG under the run
directory, ``CHART`` (``auc-per-hour.png``), drawn with matplotlib's Agg backend (no display).

Top panel, per hour H the version exported after hour H-1 is scored on (x: the scored hour,
``YYYYMMDD/HH``): the trainer's next-hour AUC (trainer 0's share of hour H before training
on it), the served next-hour AUC (the version through serving), the base alone (the first
version's dense model and table, offline) and the true-logit AUC (the generator's ceiling).
Bottom panel: rollout seconds per version (donefile line to every cube instance enabled),
bars coloured by kind (base / patch).

Needs matplotlib (the ``tracking-server`` extra, which ``make install`` installs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

CHART = "auc-per-hour.png"


def write_chart(path: str | Path, hours: Sequence[str], trainer_auc: Sequence[Optional[float]],
                served_auc: Sequence[Optional[float]], base_alone_auc: Sequence[Optional[float]],
                true_logit_auc: Sequence[Optional[float]], versions: Sequence[int], kinds: Sequence[str],
                rollout_s: Sequence[float]) -> Path:
    """Writes the chart (module docstring) to ``path`` and returns it.

    Args:
        hours: the scored hours (x axis), one per version.
        trainer_auc, served_auc, base_alone_auc, true_logit_auc: AUC per hour (None: no point).
        versions, kinds, rollout_s: per version its id, ``base``/``patch`` and rollout seconds.

    Raises ``ValueError`` when the sequences do not all have one entry per hour."""
    n = len(hours)
    for name, seq in (("trainer_auc", trainer_auc), ("served_auc", served_auc), ("base_alone_auc", base_alone_auc),
                      ("true_logit_auc", true_logit_auc), ("versions", versions), ("kinds", kinds),
                      ("rollout_s", rollout_s)):
        if len(seq) != n:
            raise ValueError(f"write_chart: {name} has {len(seq)} entries, hours has {n}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(n))
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 1.4]}, sharex=True)
    for label, seq, style in (("trainer, next hour (before training on it)", trainer_auc, "o-"),
                              ("served, next hour", served_auc, "s-"),
                              ("base alone", base_alone_auc, "^--"),
                              ("true logit (ceiling)", true_logit_auc, "k:")):
        pts = [(i, v) for i, v in zip(x, seq) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_ylabel("AUC")
    fig.suptitle("elastic-ctr online demo: next-hour AUC of each version")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4, fontsize=8, frameon=False)  # above the plot
    colors = ["tab:blue" if k == "base" else "tab:orange" for k in kinds]
    bx.bar(x, rollout_s, color=colors)
    for i, (v, k, s) in enumerate(zip(versions, kinds, rollout_s)):
        bx.annotate(f"{k}\n{s:.1f}s", (i, s), ha="center", va="bottom", fontsize=7)
    bx.set_ylabel("rollout s")
    bx.set_xticks(x)
    bx.set_xticklabels(hours, rotation=20, fontsize=8)
    bx.set_xlabel("scored hour (the version exported after the hour before)")
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
