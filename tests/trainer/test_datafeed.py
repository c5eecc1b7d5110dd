"""MultiSlot text (runtime.trainer.datafeed): what the writer writes, the reader mirror reads
back exactly (ids) or to 5e-10 (dense); bad batches are refused naming the row."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.trainer import datafeed


def _batch(n: int, seed: int = 0, slots: int = 26):
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, 13)) * rng.choice([1e-6, 1.0, 3e4], size=(n, 13))).astype(np.float32)
    ids = rng.integers(1, np.iinfo(np.uint64).max, size=(n, slots), dtype=np.uint64)
    ids[0, 0] = 1  # widths differ within a batch
    labels = rng.integers(0, 2, size=n)
    return dense, ids, labels


def test_roundtrip_exact_ids_and_close_dense():
    dense, ids, labels = _batch(500)
    text = datafeed.encode(dense, ids, labels)
    assert text.count(b"\n") == 500 and text.endswith(b"\n")
    l2, d2, i2 = datafeed.decode(text, 13, 26)
    assert np.array_equal(i2, ids)
    assert np.array_equal(l2, labels)
    assert np.max(np.abs(d2.astype(np.float64) - dense.astype(np.float64))) <= 5e-10 + 1e-7 * np.abs(dense).max()


def test_line_layout_matches_use_vars():
    line = datafeed.encode(np.array([[-1.5, 0.25]]), np.array([[7, 12345]], dtype=np.uint64), np.array([1]))
    f = line.split()
    # dense: count 2, two values; two slots "1 <id>"; label "1 1"
    assert f[0] == b"2" and float(f[1]) == -1.5 and float(f[2]) == 0.25
    assert f[3:7] == [b"1", b"00007", b"1", b"12345"]
    assert f[7:] == [b"1", b"1"]
    assert datafeed.use_var_names(2) == ["dense_input", "C1", "C2", "label"]


def test_empty_batch():
    assert datafeed.encode(np.zeros((0, 13)), np.zeros((0, 26), np.uint64), np.zeros(0)) == b""


@pytest.mark.parametrize("bad, needle", [
    ("nan", "row 3, column 4"),
    ("inf", "row 3, column 4"),
    ("huge", "row 3, column 4"),
    ("label", "label 2 at row 3"),
    ("shape", "do not describe the same rows"),
])
def test_bad_batches_are_refused(bad, needle):
    dense, ids, labels = _batch(5)
    dense = dense.astype(np.float64)
    if bad == "nan":
        dense[3, 4] = np.nan
    elif bad == "inf":
        dense[3, 4] = np.inf
    elif bad == "huge":
        dense[3, 4] = 2e9
    elif bad == "label":
        labels[3] = 2
    elif bad == "shape":
        ids = ids[:4]
    with pytest.raises(ValueError, match=needle):
        datafeed.encode(dense, ids, labels)


def test_decode_names_bad_line():
    good = datafeed.encode(np.zeros((1, 2)), np.ones((1, 1), np.uint64), np.zeros(1))
    with pytest.raises(ValueError, match="line 2"):
        datafeed.decode(good + b"2 0.5\n", 2, 1)
