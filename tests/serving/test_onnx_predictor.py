"""The ONNX Runtime predictor (runtime/inference_onnx.py): bound buffers per batch size
answer as ``InferenceSession.run`` with the inputs passed in, across batch sizes (more
than it keeps bound) and under threads; bad shapes and a model that does not match its
metadata are refused by name."""
from __future__ import annotations

import shutil
import threading

import numpy as np
import onnxruntime as ort
import pytest

from runtime import inference_onnx
from runtime.formats.model_meta import ModelMeta
from runtime.inference import PredictorError
from runtime.inference_onnx import OnnxPredictor
from tests.helpers import V1


def _inputs(meta, n, seed):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 13), dtype=np.float32),
            rng.normal(0, 0.5, (meta.num_slots * n, meta.embedding_dim)).astype(np.float32))


def _reference(sess, meta, dense, emb):
    n = dense.shape[0]
    feed = {meta.dense_feed: dense, **{f: emb[s * n:(s + 1) * n] for s, f in enumerate(meta.emb_feeds)}}
    return sess.run([meta.fetch], feed)[0]


def test_onnx_bound_inputs_answer_as_run_across_batch_sizes(env):
    d = env["dirs"][V1]
    meta = ModelMeta.read(d)
    p = OnnxPredictor(d)
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    sizes = [1, 3, 1, 256, 7, 2, 9, 1, 3]  # more sizes than BOUND_SIZES: bindings are dropped and made again
    assert len(set(sizes)) > inference_onnx.BOUND_SIZES
    outs = []
    for i, n in enumerate(sizes):
        dense, emb = _inputs(meta, n, i)
        got = p.predict(dense, emb)
        assert got.shape == (n, 1) and got.dtype == np.float32
        np.testing.assert_array_equal(got, _reference(sess, meta, dense, emb))
        outs.append(got)
    # an answer is the caller's: the next run of the same size does not overwrite it
    dense, emb = _inputs(meta, 1, 0)
    np.testing.assert_array_equal(outs[0], p.predict(dense, emb))
    np.testing.assert_array_equal(outs[0], _reference(sess, meta, dense, emb))


def test_onnx_bindings_per_thread_answer_alike(env):
    d = env["dirs"][V1]
    meta = ModelMeta.read(d)
    p = OnnxPredictor(d, pool_size=3)
    cases = [_inputs(meta, n, n) for n in (1, 2, 5, 16)]
    want = [p.predict(*c) for c in cases]
    errors = []

    def run(k):
        for i in range(60):
            j = (i + k) % len(cases)
            if not np.array_equal(p.predict(*cases[j]), want[j]):
                errors.append((k, i))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("dense_shape, emb_rows, needle", [
    ((0, 13), 0, "empty batch"), ((2, 12), 52, "dense: shape"), ((2, 13), 51, "embeddings: shape")])
def test_onnx_wrong_shapes_are_refused(env, dense_shape, emb_rows, needle):
    p = OnnxPredictor(env["dirs"][V1])
    with pytest.raises(ValueError, match=needle):
        p.predict(np.zeros(dense_shape, np.float32), np.zeros((emb_rows, 4), np.float32))


def test_onnx_model_not_matching_its_metadata_is_refused(env, tmp_path):
    d = tmp_path / "dense"
    shutil.copytree(env["dirs"][V1], d)
    meta = ModelMeta.read(d)
    renamed = meta.model_copy(update={"feeds": [meta.feeds[0]] + [f"slot_{i}" for i in range(meta.num_slots)]})
    with pytest.raises(PredictorError, match="do not match model_meta.json's feeds"):
        OnnxPredictor(d, renamed)
    (d / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(PredictorError, match="model.onnx: cannot load"):
        OnnxPredictor(d)
