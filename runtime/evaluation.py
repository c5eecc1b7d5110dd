"""Evaluation metrics shared by the trainer, the demo client and the benchmarks."""
from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC (Mann-Whitney U with average ranks for ties). ``labels`` 0/1[n],
    ``scores`` float[n]. Returns NaN if only one class is present."""
    y = np.asarray(labels).astype(bool).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    npos = int(y.sum())
    nneg = y.size - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # average ranks over ties
    bounds = np.r_[0, np.flatnonzero(np.diff(ss)) + 1, s.size]
    avg = (bounds[:-1] + bounds[1:] + 1) / 2.0
    ranks[order] = np.repeat(avg, np.diff(bounds))
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))
