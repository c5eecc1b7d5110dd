"""Each version's evaluation on rows set aside (runtime.trainer.model_eval,
runtime.formats.version_eval): rows never staged, the previous export's figures beside the
exported one's on a rolling window of rows, and an export with blown-up parameters is one
the transfer's model gate holds, at hourly and at 1-minute partitions."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from runtime.cube.transfer import model_gate
from runtime.formats import version_eval
from runtime.trainer import dataset, generator, model_eval, readers


def test_rows_set_aside_are_never_staged(tmp_path):
    generator.generate_hours(tmp_path, 1, "20261120/00", 1000, seed=2)
    (f,) = sorted(tmp_path.glob("20261120/00/part-*"))
    st = dataset.stage([str(f)], fmt="criteo", slots=range(1, 27), parts=1, keep_rows=True, holdout_every=20)
    staged = sum(1 for _ in open(st.files[0]))
    st.remove()
    assert len(st.evaluation) == 50 and st.rows == staged == 950 and len(st.holdout) == 1000
    every = readers.read_all([str(f)])
    assert np.array_equal(st.evaluation.labels, every.labels[19::20])


class _Model:
    """A worker scoring a row by its latent logit (kept in dense column 0): a calibrated
    model, or the same logit x 25 (blown-up parameters: predictions pinned near 0 and 1)."""

    who = "fake"
    blown = False

    def predict(self, batch):
        z = batch.dense[:, 0].astype(np.float64) * (25.0 if self.blown else 1.0)
        return 1 / (1 + np.exp(-z))


def _rows(n: int, seed: int) -> SimpleNamespace:
    """A staged partition whose ``n`` rows set aside carry their latent logit in dense 0."""
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.3, 1.0, n)
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    dense = np.zeros((n, 13), np.float32)
    dense[:, 0] = z
    return SimpleNamespace(evaluation=readers.Batch(labels, dense, np.zeros((n, 26), np.uint64)))


def _judged(c: model_eval.Collector, w: _Model) -> tuple[version_eval.VersionEvaluation, list[str]]:
    rec = version_eval.VersionEvaluation.model_validate(c.finish(w))
    return rec, model_gate.reasons(rec, model_gate.Thresholds())


def test_an_export_with_blown_up_parameters_is_held():
    """Hourly partitions (more rows set aside than the window): the first version has no
    baseline; one with blown-up parameters is held beside the previous export on the same
    rows; the next good one passes."""
    w, c = _Model(), model_eval.Collector()
    c.before(w, _rows(2500, 0), "20261120/05", scored=False)
    first, why = _judged(c, w)
    assert first.baseline is None and first.rows == 2500 and why == []
    c.before(w, _rows(2500, 1), "20261120/06", scored=True)  # predicted by the export of 05
    w.blown = True
    rec, why = _judged(c, w)
    assert (rec.hour, rec.first_hour, rec.partitions, rec.rows) == ("20261120/06", "20261120/06", 1, 2500)
    assert rec.candidate.logloss > 2 * rec.baseline.logloss and why  # held
    w.blown = False
    c.before(w, _rows(2500, 2), "20261120/07", scored=True)  # the baseline: the held export's predictions
    good, why = _judged(c, w)
    assert good.hour == "20261120/07" and why == []


def _minute_versions(window_rows: int, broken: int) -> list[tuple[version_eval.VersionEvaluation, list[str]]]:
    """12 one-minute partitions of 420 rows set aside (trainer 0's 1 in 20 at 1M rows/hour),
    a version after each; version ``broken`` is exported with blown-up parameters."""
    w, c = _Model(), model_eval.Collector(window_rows=window_rows)
    out = []
    for i in range(12):
        c.before(w, _rows(420, 10 + i), f"20261120/07{i:02d}", scored=i > 0)
        w.blown = i == broken
        out.append(_judged(c, w))
        w.blown = False
    return out


def test_minute_partitions_a_broken_version_is_held_by_the_window():
    """The breakage one partition's rows miss: at 1-minute partitions a version with
    blown-up parameters, evaluated on its own partition's 420 rows (a window of one
    partition), is under the model gate's 500-row minimum and passes; the rolling window
    (the default 2000 rows: 5 partitions) judges it and holds it, while every good version
    before and after it passes."""
    alone = _minute_versions(window_rows=1, broken=6)
    assert [rec.rows for rec, _ in alone[1:]] == [420] * 11
    assert alone[6][1] == [] and alone[6][0].candidate.logloss > 2 * alone[6][0].baseline.logloss  # missed
    held = _minute_versions(window_rows=model_eval.WINDOW_ROWS, broken=6)
    assert [rec.partitions for rec, _ in held[1:]] == [2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5]
    assert [rec.rows for rec, _ in held][5:] == [2100] * 7
    assert [bool(why) for _, why in held] == [False] * 6 + [True] + [False] * 5, [why for _, why in held]
    rec = held[6][0]
    assert (rec.first_hour, rec.hour) == ("20261120/0702", "20261120/0706")


def test_partitions_trained_after_the_export_point_join_at_the_next_export():
    """Several partitions per version (--patch-every-seconds): the rows of the partitions
    trained after the first since the export have no previous predictions (the model had
    moved), so the version is compared on the others; all of them join at the next one."""
    w, c = _Model(), model_eval.Collector(window_rows=5000)
    c.before(w, _rows(400, 1), "20261120/0700", scored=False)
    c.finish(w)
    for i in range(1, 4):
        c.before(w, _rows(400, 1 + i), f"20261120/07{i:02d}", scored=True)
    rec, _ = _judged(c, w)
    assert (rec.rows, rec.partitions, rec.first_hour, rec.hour) == (800, 2, "20261120/0700", "20261120/0701")
    c.before(w, _rows(400, 9), "20261120/0704", scored=True)
    rec, _ = _judged(c, w)
    assert (rec.rows, rec.partitions, rec.first_hour, rec.hour) == (2000, 5, "20261120/0700", "20261120/0704")


def test_minute_partitions_a_model_broken_by_one_minute_is_held_until_it_recovers(tmp_path):
    """At process level (--single continuous, 1-minute partitions of 4000 rows: 200 set aside
    each, under the model gate's 500-row minimum on its own), the data gate off and minute
    0006's labels flipped: the model trained on it is broken for the versions after it.
    Each version's evaluation is on the rolling window (up to 2000 rows, 10 partitions);
    the transfer's model gate, reading the versions in order, passes the six before it and
    holds every one after it, some only against the last passed version (their baseline,
    the held version before them, is as broken)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from runtime.formats import donefile, partitions
    from runtime.formats.model_meta import ModelMeta

    root = tmp_path / "hours"
    generator.generate_hours(root, 10, "20261120/0000", 4000, seed=6, minutes=1)
    (f,) = partitions.files(str(root), partitions.Partition.parse("20261120/0006", minutes=1))
    lines = Path(f).read_text().splitlines()
    Path(f).write_text("".join(str(1 - int(x[0])) + x[1:] + "\n" for x in lines))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--single", "--mode", "continuous",
                        "--data-root", str(root), "--start-hour", "20261120/0000", "--end-hour", "20261120/0009",
                        "--partition-minutes", "1", "--state-dir", str(tmp_path / "state"), "--output", str(out),
                        "--poll-seconds", "0.2", "--gate-window", "0"],
                       capture_output=True, text=True, timeout=400, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    recs = sorted(donefile.read(str(out), "base") + donefile.read(str(out), "patch"), key=lambda x: x.id)
    evs = [version_eval.from_metrics(ModelMeta.read(out / x.model).metrics, x.model) for x in recs]
    assert [e.rows for e in evs] == [200 * i for i in range(1, 11)] and 200 < model_gate.Thresholds().min_rows
    assert (evs[6].first_hour, evs[6].hour, evs[6].partitions) == ("20261120/0000", "20261120/0006", 7)
    gate = model_gate.ModelGate(str(out))
    assert [gate.held(x) for x in recs] == [False] * 6 + [True] * 4, gate.verdicts
    alone = [model_gate.reasons(e, model_gate.Thresholds()) for e in evs[7:]]
    assert any(why == [] for why in alone), alone  # held by the chain only
    assert all("held since version" in gate.verdicts[x.id][-1] for x in recs[7:])
