"""Each version's evaluation on rows set aside (runtime.trainer.model_eval,
runtime.formats.version_eval): rows never staged, the previous model's figures beside the
exported one's, and an export with blown-up parameters is one the transfer's model gate holds."""
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


def test_an_export_with_blown_up_parameters_is_held():
    rng = np.random.default_rng(0)
    z = rng.normal(-1.3, 1.0, 400)
    labels = (rng.uniform(size=400) < 1 / (1 + np.exp(-z))).astype(np.int64)
    dense = np.zeros((400, 13), np.float32)
    dense[:, 0] = z
    ev_rows = readers.Batch(labels, dense, np.zeros((400, 26), np.uint64))
    staged = SimpleNamespace(evaluation=ev_rows)
    w, c = _Model(), model_eval.Collector()
    c.before(w, staged, "20261120/05", scored=True)
    c.before(w, SimpleNamespace(evaluation=ev_rows), "20261120/06", scored=True)  # the first partition's rows kept
    w.blown = True
    rec = version_eval.VersionEvaluation.model_validate(c.finish(w))
    assert rec.hour == "20261120/05" and rec.rows == 400 and rec.baseline is not None
    assert rec.candidate.logloss > 2 * rec.baseline.logloss
    assert model_gate.reasons(rec, model_gate.Thresholds(min_rows=400))  # held
    w.blown = False
    c.before(w, staged, "20261120/07", scored=True)
    good = version_eval.VersionEvaluation.model_validate(c.finish(w))
    assert good.hour == "20261120/07" and model_gate.reasons(good, model_gate.Thresholds(min_rows=400)) == []
    assert c.finish(w) is None  # nothing kept since
