"""Train AUC from Paddle's ``auc`` op: the op keeps per-threshold bucket counts of
positives and negatives (``runtime.trainer.model.add_auc``); the worker reads them after a
pass (examples trained, train AUC) and its progress handler during one."""
from __future__ import annotations

import numpy as np


def bucket_auc(stat_pos: np.ndarray, stat_neg: np.ndarray) -> float:
    """ROC AUC from the ``auc`` op's bucket counts (int64[..., T+1]: positives / negatives
    per threshold bucket, bucket index = floor(p * T)), trapezoids over the buckets from the
    highest threshold down, as ``paddle.distributed.fleet.metrics.auc`` integrates them.
    Returns NaN when a class is absent."""
    pos = np.asarray(stat_pos, dtype=np.float64).reshape(-1)[::-1]
    neg = np.asarray(stat_neg, dtype=np.float64).reshape(-1)[::-1]
    tp, fp = np.cumsum(pos), np.cumsum(neg)
    if tp[-1] == 0 or fp[-1] == 0:
        return float("nan")
    area = np.sum((fp - np.r_[0.0, fp[:-1]]) * (tp + np.r_[0.0, tp[:-1]]) / 2.0)
    return float(area / (tp[-1] * fp[-1]))
