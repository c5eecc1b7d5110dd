"""The ONNX copy of a version's dense network: ``dense/model.onnx`` beside the Paddle
inference program, checked against Paddle Inference before it is published
(``runtime.formats.model_meta.OnnxExport`` records the outcome).

Conversion: paddle2onnx (``paddle2onnx.export``, its documented Python entry point) turns
the legacy program and parameters into ONNX (opset ``OPSET``), in a child process
(``python -m runtime.trainer.onnx_export --serve``, at most ``CONVERT_TIMEOUT_S`` a
conversion): the converter translates the program to Paddle's new IR through the
executor's global scope and switches the IR flags while it runs, which a trainer's
process, holding the trained parameters in that scope, must not see; and a converter that
crashes takes only the child with it. The child lives as long as the trainer
(``Converter``: one per process, started at the first export, started again after a
failure) and converts one version per request, so its imports of Paddle and paddle2onnx
(about 3 s) are paid once, not at every export; a conversion runs while the export writes
the sparse files (``start_conversion``). Its output is renamed to the program's fetch (``prob``), so the ONNX model's
inputs and output are the ``feeds`` and ``fetches`` of ``model_meta.json``, and the model
passes ``onnx.checker``. The converter's own graph folding (Polygraphy, which may install
packages at run time) is not used: ONNX Runtime folds constants when it loads the model.

Check: ONNX Runtime (``runtime.inference_onnx.OnnxPredictor``, serving's session) and
Paddle Inference (``runtime.inference.DensePredictor``, serving's predictor) run the same
sample (``sample_inputs``: ``CHECK_ROWS`` rows whose embeddings are drawn from the
version's own sparse rows, one batch, and its first row alone); the version keeps
``model.onnx`` only when every probability agrees within ``ONNX_TOLERANCE``. Otherwise (or
when the conversion fails) the file is removed and the version is published for Paddle
Inference alone: ``export_onnx`` returns the record with ``error`` set, and the export
logs it, counts it (``elastic_ctr_trainer_onnx_exports_total{result}``) and records it in
``model_meta.json``, which the training job's MLflow run keeps for every version.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from runtime.formats import model_meta
from runtime.formats.model_meta import ModelMeta, OnnxExport

log = logging.getLogger(__name__)

FILE = "model.onnx"
#: the ONNX opset written (ONNX Runtime, Triton's onnxruntime backend and KServe's
#: runtimes all read it)
OPSET = 13
#: seconds the conversion may take (3.3 s on 2 loaded cores, most of it the child's imports
#: of Paddle and paddle2onnx; the conversion itself 0.1 s)
CONVERT_TIMEOUT_S = 300.0
#: rows of the check's sample
CHECK_ROWS = 256
#: outcomes counted by ``elastic_ctr_trainer_onnx_exports_total{result}``
RESULTS = ("ok", "conversion_failed", "check_failed")


class OnnxExportError(RuntimeError):
    """The conversion or the check failed; the message says which and why. ``result``:
    ``conversion_failed`` or ``check_failed``."""

    def __init__(self, message: str, result: str):
        super().__init__(message)
        self.result = result


def converter_version() -> str:
    """``paddle2onnx <version>`` as installed (without importing it), or ``paddle2onnx``
    when it is not installed."""
    from importlib import metadata

    try:
        return f"paddle2onnx {metadata.version('paddle2onnx')}"
    except metadata.PackageNotFoundError:
        return "paddle2onnx"


#: the prefix of the converter child's reply lines (its other output is the libraries')
REPLY = "ELASTIC_CTR_ONNX_REPLY "


class Converter:
    """The converter child of this process (module docstring): ``request`` sends one
    conversion and waits for its reply. Thread-safe (one conversion at a time)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.replies: queue.Queue = queue.Queue()
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.trainer.onnx_export", "--serve"], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(os.environ, GLOG_minloglevel="2"), bufsize=1)
        replies, tail = queue.Queue(), []

        def read():  # the child's output: reply lines to the queue, the rest kept for errors
            for line in proc.stdout:
                if line.startswith(REPLY):
                    replies.put(json.loads(line[len(REPLY):]))
                else:
                    tail[:] = (tail + [line.strip()])[-3:]
            replies.put({"ok": False, "error": "the converter exited: " + (" | ".join(tail) or "no output")})

        threading.Thread(target=read, name="onnx-converter", daemon=True).start()
        self.replies = replies
        return proc

    def request(self, job: dict, timeout_s: float) -> None:
        """Converts ``job`` (``_convert_here``'s arguments) in the child, started if need be.
        Raises ``OnnxExportError`` (``conversion_failed``) with the child's reason, or when
        it runs past ``timeout_s`` (the child is then stopped; the next request starts
        another)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            try:
                self.proc.stdin.write(json.dumps(job) + "\n")
                self.proc.stdin.flush()
                reply = self.replies.get(timeout=timeout_s)
            except (OSError, queue.Empty) as exc:
                self.close()
                why = f"ran past {timeout_s:.0f} s" if isinstance(exc, queue.Empty) else f"cannot be reached ({exc})"
                raise OnnxExportError(f"conversion: paddle2onnx {why}", "conversion_failed") from None
            if not reply.get("ok"):
                if self.proc.poll() is not None:
                    self.proc = None
                raise OnnxExportError(f"conversion: paddle2onnx failed: {reply.get('error')}", "conversion_failed")

    def close(self) -> None:
        """Stops the child (it also ends by itself when this process exits: its stdin closes)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


_CONVERTER = Converter()


def convert(dense_dir: Path, meta: ModelMeta, opset: int = OPSET, timeout_s: float = CONVERT_TIMEOUT_S) -> Path:
    """Writes ``dense_dir/model.onnx`` from the program and parameters ``meta`` names, in
    the converter child (module docstring). Returns its path. Raises ``OnnxExportError``
    (``conversion_failed``) with the child's reason when it fails or runs past
    ``timeout_s``."""
    prog, params = meta.files_in(dense_dir)
    return convert_files(Path(dense_dir), prog.name, params.name, meta.fetch, opset, timeout_s)


def convert_files(dense_dir: Path, program: str, params: str, fetch: str, opset: int = OPSET,
                  timeout_s: float = CONVERT_TIMEOUT_S) -> Path:
    """``convert`` from the file names of the program and its parameters in ``dense_dir``
    and the name of its output (``fetch``)."""
    out = Path(dense_dir) / FILE
    _CONVERTER.request({"program": str(Path(dense_dir) / program), "params": str(Path(dense_dir) / params),
                        "out": str(out), "opset": int(opset), "output_name": fetch}, timeout_s)
    if not out.is_file():
        raise OnnxExportError(f"conversion: paddle2onnx wrote no {out.name}", "conversion_failed")
    return out


class Conversion:
    """A conversion running while the export goes on (``start_conversion``): ``wait()``
    returns ``None`` or the ``OnnxExportError`` it raised."""

    def __init__(self, *args):
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, args=args, name="onnx-conversion", daemon=True)
        self.thread.start()

    def _run(self, *args) -> None:
        try:
            convert_files(*args)
        except Exception as exc:  # noqa: BLE001 - handed to wait()'s caller, which says why
            self.error = exc

    def wait(self) -> Exception | None:
        self.thread.join()
        return self.error


def start_conversion(dense_dir: Path, program: str, params: str, fetch: str) -> Conversion:
    """Starts converting the dense model staged in ``dense_dir`` (the file names of its
    program and parameters, the name of its output); the caller writes the rest of the
    version meanwhile and passes the result to ``export_onnx``."""
    return Conversion(Path(dense_dir), program, params, fetch)


def sample_inputs(meta: ModelMeta, values: np.ndarray, rows: int = CHECK_ROWS,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The check's inputs: ``(dense float32[rows, num_dense], emb float32[S*rows, dim])``.
    Each embedding is a row of ``values`` (float32[m, dim], the version's sparse rows)
    drawn at random, one in eight a zero vector (a key the table lacks, as serving looks
    it up); with no rows, small normal values. Dense features are uniform in [0, 1] (the
    normalized range), one in five 0 (missing)."""
    rng = np.random.default_rng(seed)
    n, s, dim = int(rows), meta.num_slots, meta.embedding_dim
    dense = rng.random((n, meta.features.num_dense), dtype=np.float32)
    dense[rng.random(dense.shape) < 0.2] = 0.0
    if len(values):
        emb = np.asarray(values, dtype=np.float32)[rng.integers(0, len(values), s * n)]
    else:
        emb = (rng.standard_normal((s * n, dim)) * 0.05).astype(np.float32)
    emb[rng.random(s * n) < 0.125] = 0.0
    return dense, np.ascontiguousarray(emb)


def check(dense_dir: Path, meta: ModelMeta, dense: np.ndarray, emb: np.ndarray) -> float:
    """The max abs difference of the probabilities of ONNX Runtime and Paddle Inference
    on ``dense`` float32[n, 13] / ``emb`` float32[S*n, dim], run as one batch and its first
    row alone (``meta`` must name the ONNX model). Raises ``OnnxExportError``
    (``check_failed``) when ONNX Runtime cannot load or run the model."""
    from runtime.inference import DensePredictor, PredictorError
    from runtime.inference_onnx import OnnxPredictor

    n = dense.shape[0]
    paddle = DensePredictor(dense_dir, meta)
    try:
        ort = OnnxPredictor(dense_dir, meta)
        diffs = [np.abs(ort.predict(d, e) - paddle.predict(d, e)).max()
                 for d, e in ((dense, emb), (dense[:1], emb[::n][:meta.num_slots]))]
    except (PredictorError, ValueError, model_meta.ModelMetaError) as exc:
        raise OnnxExportError(f"check: ONNX Runtime cannot run the model: {exc}", "check_failed") from None
    return float(max(diffs))


def export_onnx(dense_dir: Path, meta: ModelMeta, values: np.ndarray, rows: int = CHECK_ROWS,
                tolerance: float = model_meta.ONNX_TOLERANCE, conversion: Conversion | None = None) -> OnnxExport:
    """Converts (or waits for ``conversion``, started by ``start_conversion``) and checks
    the dense model staged in ``dense_dir`` (``meta``: its metadata, without ``onnx``;
    ``values``: float32[m, dim], the version's sparse rows the sample draws from). Returns
    the ``onnx`` record of ``model_meta.json``: ``file`` set when ``model.onnx`` passed the
    check, else ``error`` (the file removed). Never raises for a failed conversion or
    check: the version is then published for Paddle Inference alone (module docstring);
    the outcome is logged and counted."""
    from runtime.metrics.trainer import metrics

    t0 = time.monotonic()
    rec = {"converter": converter_version(), "opset": OPSET, "check_rows": 0, "tolerance": tolerance}
    out = Path(dense_dir) / FILE
    try:
        from runtime import inference_onnx

        rec["runtime"] = inference_onnx.version()
        if conversion is None:
            convert(dense_dir, meta)
        elif (failed := conversion.wait()) is not None:
            raise failed
        checked = meta.model_copy(update={"onnx": OnnxExport(file=FILE, converter=rec["converter"], opset=OPSET,
                                                             check_rows=rows, max_abs_diff=0.0)})
        dense, emb = sample_inputs(meta, values, rows)
        diff = check(dense_dir, checked, dense, emb)
        rec.update(check_rows=rows, max_abs_diff=diff)
        if not diff <= tolerance:
            raise OnnxExportError(f"check: ONNX Runtime and Paddle Inference differ by {diff:.3g} on {rows} sample rows "
                                  f"(at most {tolerance:g} allowed)", "check_failed")
        result = "ok"
        rec["file"] = FILE
        log.info("version %d: %s written and checked (max abs difference %.2g on %d rows) in %.1f s", meta.version,
                 FILE, diff, rows, time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the version to Paddle Inference, said why
        result = exc.result if isinstance(exc, OnnxExportError) else "conversion_failed"
        rec["error"] = str(exc) if isinstance(exc, OnnxExportError) else f"{type(exc).__name__}: {exc}"
        out.unlink(missing_ok=True)
        log.warning("version %d: no %s, published for Paddle Inference alone: %s", meta.version, FILE, rec["error"])
    metrics().onnx_export(result)
    return OnnxExport(**rec)


def _convert_here(program: str, params: str, out: str, opset: int, output_name: str) -> None:
    """The child's work (``convert``): paddle2onnx, the output renamed, ``onnx.checker``,
    the file written under a temporary name then renamed."""
    from runtime.trainer import set_paddle_flags

    set_paddle_flags()
    import onnx
    import paddle2onnx

    data = paddle2onnx.export(program, params, save_file=None, opset_version=opset, auto_upgrade_opset=False,
                              enable_onnx_checker=True, enable_optimize=True)
    model = onnx.load_from_string(data)
    if len(model.graph.output) != 1:
        raise SystemExit(f"paddle2onnx wrote {len(model.graph.output)} outputs, expected 1")
    old = model.graph.output[0].name
    if old != output_name:
        for node in model.graph.node:
            node.output[:] = [output_name if o == old else o for o in node.output]
        model.graph.output[0].name = output_name
    onnx.checker.check_model(model, full_check=True)
    tmp = out + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, out)


def _serve() -> int:
    """The converter child's loop: one JSON request per line on stdin (``_convert_here``'s
    arguments), one ``REPLY`` line per request on stdout (``{"ok": true}`` or ``{"ok":
    false, "error": ...}``), until stdin closes."""
    for line in sys.stdin:
        try:
            _convert_here(**json.loads(line))
            reply = {"ok": True}
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the reason goes back to the trainer
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(REPLY + json.dumps(reply), flush=True)
    return 0


def _main(argv: list[str] | None = None) -> int:
    """``python -m runtime.trainer.onnx_export``: converts a Paddle inference model (legacy
    program + parameters) to ONNX; ``--serve``: converts one per request line (what
    ``Converter`` runs as its child)."""
    ap = argparse.ArgumentParser(prog="python -m runtime.trainer.onnx_export", description=_main.__doc__)
    ap.add_argument("--serve", action="store_true", help="convert the JSON requests read from stdin")
    ap.add_argument("--program", help="the program (.pdmodel)")
    ap.add_argument("--params", help="its parameters (.pdiparams)")
    ap.add_argument("--out", help="the ONNX model to write")
    ap.add_argument("--opset", type=int, default=OPSET, help="ONNX opset")
    ap.add_argument("--output-name", default="prob", help="name of the model's output")
    args = ap.parse_args(argv)
    if args.serve:
        return _serve()
    if not (args.program and args.params and args.out):
        ap.error("--program, --params and --out are required (or --serve)")
    _convert_here(args.program, args.params, args.out, args.opset, args.output_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
