"""The dense predictor's bound inputs (``DensePredictor`` with ``zero_copy``): the same
answers as feeding every input with ``copy_from_cpu``, whatever the order of batch sizes
and threads, and a clear error for embeddings of the wrong shape."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime.formats import features
from runtime.inference import DensePredictor
from tests.helpers import V1


def _inputs(pred: DensePredictor, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    raw = rng.integers(0, 300, (n, 13)).astype(np.float64)
    raw[rng.random((n, 13)) < 0.2] = np.nan
    emb = rng.normal(0, 0.5, (pred.num_slots * n, pred.dim)).astype(np.float32)
    return features.normalize_dense(raw), emb


def test_bound_inputs_answer_as_copied_inputs_across_batch_sizes(env):
    """Batch sizes in a random order (each change binds the inputs anew): every answer
    equals, bit for bit, the one the copying predictor gives for the same arrays; the
    arrays the caller passed are left as they were."""
    bound = DensePredictor(env["dirs"][V1], pool_size=1)
    copied = DensePredictor(env["dirs"][V1], pool_size=1, zero_copy=False)
    assert bound.zero_copy and not copied.zero_copy
    rng = np.random.default_rng(5)
    sizes = [1, 256, 1, 7, 7, 300, 2, 256, 1]
    for n in sizes + [int(x) for x in rng.integers(1, 64, 20)]:
        dense, emb = _inputs(bound, n, rng)
        before = (dense.copy(), emb.copy())
        got, want = bound.predict(dense, emb), copied.predict(dense, emb)
        assert got.shape == want.shape == (n, 1)
        assert np.array_equal(got, want), f"batch {n}: bound inputs answer {got.ravel()[:4]}, copied {want.ravel()[:4]}"
        assert np.array_equal(dense, before[0]) and np.array_equal(emb, before[1])
        # the answer is the caller's: a later call does not change it
        kept = got.copy()
        bound.predict(*_inputs(bound, n, rng))
        assert np.array_equal(got, kept)


def test_bound_inputs_per_predictor_under_threads(env):
    """A pool of 2 predictors, 4 threads each sending its own batch sizes: every answer
    is the copying predictor's for its own arrays (no predictor reads another call's
    buffers)."""
    bound = DensePredictor(env["dirs"][V1], pool_size=2)
    copied = DensePredictor(env["dirs"][V1], pool_size=1, zero_copy=False)
    cases = []
    rng = np.random.default_rng(11)
    for t in range(4):
        cases.append([_inputs(bound, int(n), rng) for n in rng.integers(1, 40, 25)])
    want = [[copied.predict(d, e) for d, e in c] for c in cases]
    got: list[list] = [[] for _ in cases]
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            for d, e in cases[t]:
                got[t].append(bound.predict(d, e))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(len(cases))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    for t in range(len(cases)):
        assert len(got[t]) == len(want[t])
        for i, (g, w) in enumerate(zip(got[t], want[t])):
            assert np.array_equal(g, w), f"thread {t} call {i}: {g.ravel()[:4]} != {w.ravel()[:4]}"


@pytest.mark.parametrize("zero_copy", [True, False])
def test_wrong_embedding_shape_is_refused(env, zero_copy):
    pred = DensePredictor(env["dirs"][V1], zero_copy=zero_copy)
    dense, emb = _inputs(pred, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"embeddings: shape \(.*expected \(%d, %d\)" % (3 * pred.num_slots, pred.dim)):
        pred.predict(dense, emb[:-1])
    assert pred.predict(dense, emb).shape == (3, 1)  # the predictor still answers


def test_static_graph_mode_copies_and_binds_again_after(env):
    """While Paddle is in static-graph mode (the trainer's export check) no input is bound
    anew (making a tensor there crashes Paddle 3.0): a new batch size is copied; back in
    dynamic mode the predictor binds again. Every answer equals the copying predictor's."""
    from runtime.inference import import_paddle

    paddle = import_paddle()
    bound = DensePredictor(env["dirs"][V1], pool_size=1)
    copied = DensePredictor(env["dirs"][V1], pool_size=1, zero_copy=False)
    rng = np.random.default_rng(3)
    steps = [(5, False), (5, True), (9, True), (5, True), (9, False), (5, False), (9, False)]
    for n, static in steps:
        dense, emb = _inputs(bound, n, rng)
        if static:
            paddle.enable_static()
        try:
            got = bound.predict(dense, emb)
        finally:
            if static:
                paddle.disable_static()
        assert np.array_equal(got, copied.predict(dense, emb)), f"batch {n} (static graph: {static})"


@pytest.mark.parametrize("zero_copy", [True, False])
def test_empty_batch_is_refused_not_run(env, zero_copy):
    """Paddle 3.0 crashes the process on a batch of 0 rows: the predictor refuses it
    first, and answers the next batch as usual."""
    pred = DensePredictor(env["dirs"][V1], zero_copy=zero_copy)
    dense, emb = _inputs(pred, 2, np.random.default_rng(1))
    with pytest.raises(ValueError, match="empty batch"):
        pred.predict(dense[:0], emb[:0])
    assert pred.predict(dense, emb).shape == (2, 1)


def test_wrong_dense_width_is_refused(env):
    pred = DensePredictor(env["dirs"][V1])
    dense, emb = _inputs(pred, 3, np.random.default_rng(2))
    with pytest.raises(ValueError, match=r"dense: shape \(3, 12\), expected \(3, %d\)" % pred.num_dense):
        pred.predict(dense[:, :12], emb)
    assert pred.predict(dense, emb).shape == (3, 1)
