"""Feasign function, parsers (incl. the real sample rows), normalization, AUC."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.evaluation import auc
from runtime.formats import features


def test_feasign_is_slot_tagged_bijection():
    assert features.feasign(1, "05db9164") == (1 << 33) | 0x05DB9164
    assert features.feasign(26, "ffffffff") == (26 << 33) | 0xFFFFFFFF
    # missing: one per slot, distinct from every real value of any slot
    miss = {features.feasign(s, "") for s in range(1, 27)}
    assert len(miss) == 26
    assert features.feasign(3, "") not in {features.feasign(3, "ffffffff"), features.feasign(3, "0")}
    assert features.feasign(2, "abc") != features.feasign(3, "abc")


@pytest.mark.parametrize("bad", ["xyz", "123456789", "-1", "0x12", " 12"])
def test_feasign_rejects_bad_hex(bad):
    with pytest.raises(features.MalformedLine):
        features.feasign(1, bad)


def test_vectorized_feasigns_match_scalar():
    rng = np.random.default_rng(0)
    vals = [f"{x:x}" for x in rng.integers(0, 1 << 32, 500)] + ["", "A1b2", "0"]
    slots = rng.integers(1, 27, len(vals))
    got, ok = features.feasigns_from_hex(np.array(vals), slots)
    assert ok.all()
    assert [int(g) for g in got] == [features.feasign(int(s), v) for s, v in zip(slots, vals)]
    _, ok = features.feasigns_from_hex(np.array(["12g4", "123456789", "ok"]), np.array([1, 2, 3]))
    assert not ok.any()


def _row(label="1", dense=None, cats=None, sep="\t"):
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return sep.join([label] + dense + cats)


def test_parse_criteo_tsv_and_csv_agree():
    tsv, csv = _row(), _row(sep=",")
    a, b = features.parse_criteo_line(tsv), features.parse_criteo_line(csv)
    assert a[0] == b[0] == 1
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])
    assert a[2].dtype == np.uint64 and a[2].shape == (26,)


def test_batch_parser_reports_bad_lines_and_keeps_good_ones():
    good = _row()
    lines = [good, _row(label="2"), _row(dense=["x"] + ["1"] * 12), _row(cats=["zz"] + ["1"] * 25),
             "1\t2\t3", _row(dense=["1.5"] + ["1"] * 12), good]
    b = features.parse_criteo_lines(lines)
    assert len(b) == 2
    assert [i for i, _ in b.bad] == [1, 2, 3, 4, 5]
    assert "label" in b.bad[0][1] and "I1" in b.bad[1][1] and "hex" in b.bad[2][1]
    assert "fields" in b.bad[3][1]


def test_missing_values():
    dense = [""] * 13
    cats = [""] * 26
    lab, d, fs = features.parse_criteo_line(_row(dense=dense, cats=cats))
    assert np.isnan(d).all()
    np.testing.assert_array_equal(fs, features.missing_feasign(np.arange(1, 27)))
    z = features.normalize_dense(d[None, :])
    assert (z == 0).all()


def test_normalization_range_and_monotone():
    x = np.array([[-5, 0, 1, 10, 1e9, np.nan, 3, 4, 5, 6, 7, 8, 9]], dtype=np.float64)
    z = features.normalize_dense(x)
    assert z.dtype == np.float32 and (z >= 0).all() and (z <= 1).all()
    assert z[0, 0] == 0 and z[0, 4] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        features.normalize_dense(np.zeros((2, 5)))


def test_real_criteo_sample(shared_dir):
    lines = (shared_dir / "data/samples/criteo_sample.csv").read_text().splitlines()
    b = features.parse_criteo_lines(lines)
    assert len(b) == 200 and not b.bad
    assert set(np.unique(b.labels)) <= {0, 1}
    # per-line parse agrees with the batch parse
    for i in (0, 57, 199):
        lab, d, fs = features.parse_criteo_line(lines[i + 1])
        assert lab == b.labels[i]
        np.testing.assert_array_equal(fs, b.feasigns[i])
    # first row, C1 = 05db9164
    assert int(b.feasigns[0, 0]) == (1 << 33) | 0x05DB9164


def test_real_slot_sample(shared_dir):
    lines = (shared_dir / "data/samples/elastic_ctr_slot_sample.txt").read_text().splitlines()
    b = features.parse_slot_lines(lines)
    assert len(b) == 100 and not b.bad
    first = lines[0].split()
    by_slot = {int(t.split(":")[1]): int(t.split(":")[0]) for t in first[2:]}
    assert [int(x) for x in b.feasigns[0]] == [by_slot[s] for s in range(1, 27)]
    assert b.labels[0] == int(first[1])
    assert np.isnan(b.dense).all()
    # a custom slot list (slots 0..2) and a missing slot
    b2 = features.parse_slot_lines(["1 1 5:0 7:2"], slots=(0, 1, 2))
    assert [int(x) for x in b2.feasigns[0]] == [5, int(features.missing_feasign(1)), 7]
    bad = features.parse_slot_lines(["1 0 12x:1", "1 0 5-1", "x y 1:1"])
    assert len(bad) == 0 and len(bad.bad) == 3


def test_load_slots():
    assert features.load_slots("1\n2\n# c\n\n3\n") == (1, 2, 3)
    with pytest.raises(ValueError):
        features.load_slots("1\nx\n")


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300), 1)  # ties
    pos, neg = s[y == 1], s[y == 0]
    want = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert auc(y, s) == pytest.approx(want)
