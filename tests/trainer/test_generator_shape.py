"""The generator's production shape (``--shape long-tail``): power-law vocabularies with
big slots, feasigns appearing and going quiet hour by hour, the true-logit AUC recorded;
the small shape stays as it was."""
from __future__ import annotations


import numpy as np
import pytest

from runtime.formats import partitions, signal
from runtime.trainer import generator, readers

START = "20261120/00"


def _hours(root, n):
    h0 = partitions.Hour.parse(START)
    return [readers.read_all(partitions.files(str(root), h0.next(t))) for t in range(n)]


def test_long_tail_shape_has_big_power_law_slots_and_churn(tmp_path):
    rec = generator.generate_hours(tmp_path, 3, START, 20_000, seed=3, shape="long-tail", scale=0.01)
    assert rec.shape == "long-tail" and max(rec.vocab_sizes) == 40_000
    assert all(0.75 < h.true_logit_auc < 1.0 for h in rec.hours)
    assert signal.read_hourly(tmp_path) == rec
    hours = _hours(tmp_path, 3)
    big = rec.vocab_sizes.index(40_000)  # a slot of the largest vocabulary
    col = hours[0].feasigns[:, big]
    vals, counts = np.unique(col, return_counts=True)
    counts = np.sort(counts)[::-1]
    # a long tail: thousands of distinct values, most seen once or twice, a head seen often
    assert len(vals) > 5_000 and (counts <= 2).mean() > 0.5 and counts[0] > 50 * np.median(counts)
    seen = [set(np.unique(h.feasigns).tolist()) for h in hours]
    small = generator.generate_hours(tmp_path / "small", 1, START, 20_000, seed=3)
    small_seen = np.unique(_hours(tmp_path / "small", 1)[0].feasigns)
    assert len(seen[0]) > 2 * len(small_seen) and small.shape == "small"
    # the table grows hour by hour: each hour brings feasigns never seen before
    assert len(seen[1] - seen[0]) > 0.3 * len(seen[1]) and len(seen[2] - seen[0] - seen[1]) > 0.2 * len(seen[2])


def test_shape_and_scale_are_checked(tmp_path):
    with pytest.raises(ValueError, match="--shape"):
        generator.generate_hours(tmp_path, 1, START, 10, shape="huge")
    with pytest.raises(ValueError, match="--table-scale"):
        generator.generate_hours(tmp_path, 1, START, 10, shape="long-tail", scale=0)
