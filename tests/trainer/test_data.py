"""Generator determinism and signal; readers: budget, sharding, missing inputs."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from runtime import storage
from runtime.formats import features, signal
from runtime.trainer import generator, readers


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    rec = generator.generate(d, 3000, 4000, seed=5)
    return d, rec


def test_generator_deterministic_and_learnable(gen, tmp_path):
    d, rec = gen
    again = generator.generate(tmp_path, 3000, 4000, seed=5)
    assert (d / "train.txt").read_bytes() == (tmp_path / "train.txt").read_bytes()
    assert again.true_logit_auc_test == rec.true_logit_auc_test
    other = generator.generate(tmp_path / "o", 3000, 4000, seed=6)
    assert (tmp_path / "o" / "train.txt").read_bytes() != (d / "train.txt").read_bytes()
    sig = signal.read_split(d)
    assert sig == rec
    assert 0.8 < sig.true_logit_auc_test < 1.0
    assert 0.1 < sig.ctr_test < 0.4
    b = features.parse_criteo_lines((d / "test.txt").read_text().splitlines())
    assert len(b) == 4000 and not b.bad
    assert other.true_logit_auc_test != rec.true_logit_auc_test


def test_sharding_partitions_rows(gen):
    d, _ = gen
    f = [str(d / "train.txt")]
    whole = readers.read_all(f)
    parts = [readers.read_all(f, budget=None) for _ in range(1)]
    s0 = np.concatenate([b.labels for b in readers.iter_batches(f, batch_size=100, shard=(0, 2))])
    s1 = np.concatenate([b.labels for b in readers.iter_batches(f, batch_size=100, shard=(1, 2))])
    assert len(s0) + len(s1) == len(whole) == 3000
    np.testing.assert_array_equal(s0, whole.labels[0::2])
    assert len(parts[0]) == 3000


def test_batches_have_shapes_and_dtypes(gen):
    d, _ = gen
    bs = list(readers.iter_batches([str(d / "test.txt")], batch_size=512))
    assert [len(b) for b in bs] == [512] * 7 + [4000 - 7 * 512]
    b = bs[0]
    assert b.dense.dtype == np.float32 and b.dense.shape == (512, 13)
    assert b.feasigns.dtype == np.uint64 and b.feasigns.shape == (512, 26)
    assert 0 <= b.dense.min() and b.dense.max() <= 1


def _with_bad(d, n_bad):
    lines = (d / "test.txt").read_text().splitlines()[:200]
    for i in range(n_bad):
        lines[10 + i] = lines[10 + i].replace("\t", "\tx", 1)
    p = d / f"bad{n_bad}.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_bad_lines_within_budget_are_skipped_with_warning(gen, caplog):
    d, _ = gen
    p = _with_bad(d, 3)
    with caplog.at_level(logging.WARNING):
        b = readers.read_all([str(p)], budget=readers.BadLineBudget(max_bad_lines=3))
    assert len(b) == 197
    assert f"{p} line 11" in caplog.text and "I1" in caplog.text


def test_bad_lines_past_budget_stop(gen):
    d, _ = gen
    p = _with_bad(d, 4)
    with pytest.raises(readers.TooManyBadLines, match="line 14"):
        readers.read_all([str(p)], budget=readers.BadLineBudget(max_bad_lines=3))
    with pytest.raises(readers.TooManyBadLines, match="fraction"):
        readers.read_all([str(p)], budget=readers.BadLineBudget(None, max_bad_fraction=0.01))


def test_missing_inputs_are_clear_errors(tmp_path):
    with pytest.raises(storage.LocationError, match="nope"):
        readers.resolve([str(tmp_path / "nope*.txt")])
    with pytest.raises(storage.LocationError, match="127.0.0.1:9"):
        readers.resolve(["http://127.0.0.1:9/data.txt"])


def test_cli_train_fails_before_starting_on_missing_file(tmp_path, capsys):
    from runtime.cli import main

    rc = main(["train", "--local-cluster", "--data-train", str(tmp_path / "absent.txt")])
    assert rc == 2
    assert "absent.txt" in capsys.readouterr().err


def test_extra_days_are_new_rows_of_the_same_model(gen, tmp_path):
    """train-day2.txt is fresh traffic from the same generative model; train/test unchanged."""
    d, rec = gen
    more = generator.generate(tmp_path, 3000, 4000, seed=5, extra_days=1)
    assert (tmp_path / "train.txt").read_bytes() == (d / "train.txt").read_bytes()
    assert (tmp_path / "test.txt").read_bytes() == (d / "test.txt").read_bytes()
    day2 = (tmp_path / "train-day2.txt").read_text().splitlines()
    day1 = (d / "train.txt").read_text().splitlines()
    assert len(day2) == 3000 and day2 != day1
    # Same model: the categorical vocabulary of a slot is shared (slot 1 has 4 values).
    v1 = {line.split("\t")[14] for line in day1} - {""}
    v2 = {line.split("\t")[14] for line in day2} - {""}
    assert v2 <= v1 and len(v1) <= 4
    assert more.files["train-day2"] == "train-day2.txt"
    with pytest.raises(ValueError, match="extra-days"):
        generator.generate(tmp_path / "x", 10, 10, extra_days=-1)
