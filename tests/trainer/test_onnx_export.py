"""The export's ONNX copy of the dense network (runtime/trainer/onnx_export.py): written,
checked against Paddle Inference and listed in the manifest; a version whose conversion
fails or disagrees is published for Paddle Inference alone, with the reason in
model_meta.json, the log and the metric. The export runs in its own process (Paddle's
flags), as the trainer runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from runtime.formats import manifest
from runtime.formats.model_meta import ONNX_TOLERANCE, ModelMeta, ModelMetaError, OnnxExport
from tests.helpers import export_version, make_table

VERSION, OTHER = 1_750_000_001, 1_750_000_002


def _table(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return make_table(rng.integers(0, 2**40, (64, 26), dtype=np.uint64), seed)


def _export_with(root: Path, version: int, seed: int, patch: str) -> subprocess.CompletedProcess:
    """The export CLI in a child process, ``patch`` (Python) run first in it (after the
    export modules are imported), its metrics printed as the last line."""
    table = _table(seed)
    keys = np.array(sorted(table), dtype=np.uint64)
    npz = root.parent / f"table-{version}.npz"
    np.savez(npz, keys=keys, values=np.stack([table[int(k)] for k in keys]).astype(np.float32))
    script = textwrap.dedent(f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from runtime.trainer import set_paddle_flags
        set_paddle_flags()
        from runtime.trainer import export, onnx_export
        from runtime.metrics.trainer import metrics
        {patch}
        export._main(["--root", {str(root)!r}, "--version", "{version}", "--seed", "{seed}", "--table", {str(npz)!r},
                      "--layers", "16"])
        print({{r: metrics().onnx_exports.labels(r)._value.get() for r in onnx_export.RESULTS}})
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOG_minloglevel="2"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    return root, export_version(root, VERSION, _table(1), seed=1)


def test_onnx_model_is_written_checked_and_listed_in_the_manifest(exported):
    root, dense = exported
    meta = ModelMeta.read(dense)
    assert meta.onnx is not None and meta.onnx.file == "model.onnx" and meta.onnx.error is None
    assert meta.onnx.converter.startswith("paddle2onnx ") and meta.onnx.runtime.startswith("onnxruntime ")
    assert meta.onnx.opset == 13 and meta.onnx.check_rows == 256
    assert 0 <= meta.onnx.max_abs_diff <= ONNX_TOLERANCE
    man = manifest.read(str(root), manifest.location(VERSION), VERSION)
    entry = man.entry("dense/model.onnx")
    assert entry is not None and entry.bytes == (dense / "model.onnx").stat().st_size
    manifest.verify_file(entry, dense / "model.onnx", "model.onnx")


def test_onnx_model_has_the_programs_inputs_and_output_and_answers_as_paddle(exported):
    import onnxruntime as ort

    from runtime.inference import DensePredictor
    from runtime.inference_onnx import OnnxPredictor

    _, dense = exported
    meta = ModelMeta.read(dense)
    sess = ort.InferenceSession(str(dense / "model.onnx"), providers=["CPUExecutionProvider"])
    assert {i.name for i in sess.get_inputs()} == set(meta.feeds)
    assert [o.name for o in sess.get_outputs()] == [meta.fetch]
    rng = np.random.default_rng(7)
    onnx, paddle = OnnxPredictor(dense), DensePredictor(dense)
    for n in (1, 5, 300):  # rows the export's check never saw, other batch sizes
        d = rng.random((n, 13), dtype=np.float32)
        e = rng.normal(0, 0.5, (meta.num_slots * n, meta.embedding_dim)).astype(np.float32)
        assert np.abs(onnx.predict(d, e) - paddle.predict(d, e)).max() <= ONNX_TOLERANCE


def test_onnx_conversion_failure_publishes_the_version_for_paddle_alone(tmp_path):
    root = tmp_path / "root"
    r = _export_with(root, VERSION, 1, textwrap.dedent("""
        def convert_files(dense_dir, program, params, fetch, **kw):
            raise onnx_export.OnnxExportError("conversion: paddle2onnx failed: unsupported op", "conversion_failed")
        onnx_export.convert_files = convert_files
    """).replace("\n", "\n        "))
    assert r.returncode == 0, r.stderr[-3000:]
    dense = root / "versions" / str(VERSION) / "dense"
    meta = ModelMeta.read(dense)
    assert meta.onnx.file is None and "unsupported op" in meta.onnx.error and meta.onnx_file is None
    assert not (dense / "model.onnx").exists()
    man = manifest.read(str(root), manifest.location(VERSION), VERSION)
    assert man.entry("dense/model.onnx") is None and man.entry("dense/inference.pdmodel") is not None
    assert f"version {VERSION}: no model.onnx, published for Paddle Inference alone" in r.stderr
    counts = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - the child's own dict
    assert counts == {"ok": 0.0, "conversion_failed": 1.0, "check_failed": 0.0}
    with pytest.raises(ModelMetaError, match="unsupported op"):
        meta.onnx_in(dense)


def test_onnx_model_disagreeing_with_paddle_is_not_published(exported, tmp_path):
    # the converter "writes" another network (OTHER's, seed 2): the check must catch it
    _, good = exported
    root = tmp_path / "root"
    r = _export_with(root, OTHER, 2, textwrap.dedent(f"""
        import shutil
        def convert_files(dense_dir, program, params, fetch, **kw):
            shutil.copy({str(good / "model.onnx")!r}, dense_dir / "model.onnx")
            return dense_dir / "model.onnx"
        onnx_export.convert_files = convert_files
    """).replace("\n", "\n        "))
    assert r.returncode == 0, r.stderr[-3000:]
    dense = root / "versions" / str(OTHER) / "dense"
    meta = ModelMeta.read(dense)
    assert meta.onnx.file is None and meta.onnx.check_rows == 256 and meta.onnx.max_abs_diff > ONNX_TOLERANCE
    assert "ONNX Runtime and Paddle Inference differ by" in meta.onnx.error
    assert not (dense / "model.onnx").exists()
    assert manifest.read(str(root), manifest.location(OTHER), OTHER).entry("dense/model.onnx") is None
    counts = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - the child's own dict
    assert counts["check_failed"] == 1.0 and counts["ok"] == 0.0


@pytest.mark.parametrize("doc, needle", [
    ({"file": None}, "needs an error"),
    ({"file": "model.onnx", "error": "x", "check_rows": 4, "max_abs_diff": 0.0}, "error: set"),
    ({"file": "../model.onnx", "check_rows": 4, "max_abs_diff": 0.0}, "plain <name>.onnx"),
    ({"file": "model.onnx", "check_rows": 4, "max_abs_diff": 0.1}, "without a passed check"),
    ({"file": "model.onnx", "check_rows": 0, "max_abs_diff": 0.0}, "without a passed check"),
])
def test_onnx_record_refuses_an_inconsistent_document(doc, needle):
    with pytest.raises(ValueError, match=needle.replace("<", ".").replace(">", ".")):
        OnnxExport(converter="paddle2onnx 2.1.0", **doc)


def test_onnx_record_round_trips_through_model_meta_json(exported, tmp_path):
    _, dense = exported
    doc = json.loads((dense / "model_meta.json").read_text())
    assert ModelMeta.parse(doc).onnx == ModelMeta.read(dense).onnx
    doc.pop("onnx")  # a version exported without an ONNX copy still reads: Paddle alone
    assert ModelMeta.parse(doc).onnx_file is None


class _Run:
    """A tracker stand-in that keeps what it is given."""

    def __init__(self):
        self.tags, self.metrics, self.dicts = {}, [], []

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, metrics))

    def log_dict(self, doc, name):
        self.dicts.append((name, doc))


@pytest.mark.parametrize("onnx, tag", [
    ({"file": "model.onnx", "error": None}, "model.onnx"),
    ({"file": None, "error": "check: ONNX Runtime and Paddle Inference differ by 0.3"},
     "none: check: ONNX Runtime and Paddle Inference differ by 0.3")])
def test_onnx_outcome_goes_to_the_jobs_run_history(onnx, tag):
    from runtime import tracking

    job = _Run()
    tracking.JobTracking(job, _Run()).version(3, {"id": 9, "kind": "base", "base": 9, "hour": None, "rows": 5,
                                                  "seconds": 1.0}, {"version": 9, "onnx": onnx})
    assert job.tags["version.9.onnx"] == tag
    assert job.dicts == [("versions/9.json", {"id": 9, "kind": "base", "base": 9, "hour": None, "rows": 5,
                                              "seconds": 1.0, "model_meta": {"version": 9, "onnx": onnx}})]


def test_onnx_converter_child_serves_every_export_and_comes_back_after_a_failure(exported, tmp_path):
    """The converter child lives across exports (one start, then a conversion per
    request), answers a bad request with its reason and keeps serving, and is started
    again after it died."""
    from runtime.trainer import onnx_export

    _, dense = exported
    meta = ModelMeta.read(dense)
    prog, params = meta.files_in(dense)
    conv = onnx_export.Converter()
    try:
        pids = []
        for i in range(2):
            job = {"program": str(prog), "params": str(params), "out": str(tmp_path / f"m{i}.onnx"),
                   "opset": onnx_export.OPSET, "output_name": meta.fetch}
            conv.request(job, 120)
            assert (tmp_path / f"m{i}.onnx").is_file()
            pids.append(conv.proc.pid)
        assert pids[0] == pids[1], "one child for every conversion"
        with pytest.raises(onnx_export.OnnxExportError, match="paddle2onnx failed"):
            conv.request(dict(job, program=str(tmp_path / "missing.pdmodel")), 120)
        assert conv.proc.pid == pids[0] and conv.proc.poll() is None, "a bad request does not stop the child"
        conv.proc.kill()
        conv.proc.wait()
        conv.request(job, 120)  # a new child
        assert conv.proc.pid != pids[0]
    finally:
        conv.close()
