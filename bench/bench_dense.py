"""The dense network alone (``make bench-dense``): ONNX Runtime against Paddle Inference on
a version the trainer's export produces, CPU µs per run at batch 1 and 256, and the max
abs difference of their probabilities; then the ONNX Runtime session options serving's
were chosen from (``runtime.inference_onnx``).

The version: ``--version-dir DIR`` (a published ``versions/<id>/dense``, e.g. the demo's
last), else one exported here by ``python -m runtime.trainer.export`` with the trainer's
default network (26 slots, embedding 9, layers 128-64-32). Inputs: ``runtime.trainer.
onnx_export.sample_inputs`` (embeddings drawn from the version's own rows when its table is
given, else small normal values). Each figure: CPU time of this process
(``time.process_time``, every thread) over ``--runs`` runs (batch 1; a tenth at batch
256), the median of 5 passes, after a warm-up. Rows:

* ``onnxruntime``: serving's ``OnnxPredictor`` (its session options, inputs bound);
* ``paddle``: serving's ``DensePredictor`` (its settings: oneDNN off, IR optimization,
  the legacy executor, inputs bound);
* ``paddle-defaults``: Paddle Inference as its ``Config`` comes (IR optimization and oneDNN
  on, the inputs copied per run), one math thread, as a new user runs it.

Then the export's cost with its ONNX copy: ``--exports`` versions (20,000 rows each)
published by one process (``python -m runtime.trainer.export --repeat``), the seconds of
the first (the converter child starting) and the median of the others.

Prints the table and ``dense batch1_onnxruntime_us=<x> batch1_paddle_us=<y>
batch256_onnxruntime_us=<z> batch256_paddle_us=<w> max_abs_diff=<d> export_s_first=<s>
export_s_p50=<s>``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime.formats.model_meta import ModelMeta  # noqa: E402


def cpu_us(fn, runs: int, passes: int = 5) -> float:
    """CPU µs (this process, every thread) per ``fn()``: the median of ``passes`` passes of
    ``runs`` calls, after ``runs // 10 + 5`` warm-up calls."""
    for _ in range(runs // 10 + 5):
        fn()
    out = []
    for _ in range(passes):
        t0 = time.process_time()
        for _ in range(runs):
            fn()
        out.append((time.process_time() - t0) / runs * 1e6)
    return float(np.median(out))


class PaddleDefaults:
    """Paddle Inference as its ``Config`` comes, one math thread: ``predict`` copies each
    input in (``copy_from_cpu``) and the output out."""

    def __init__(self, model_dir: Path, meta: ModelMeta):
        from runtime.inference import import_paddle

        import_paddle()
        from paddle import inference

        prog, params = meta.files_in(model_dir)
        config = inference.Config(str(prog), str(params))
        config.disable_gpu()
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(1)
        self.p = inference.create_predictor(config)
        self.meta = meta
        self.inputs = [self.p.get_input_handle(n) for n in meta.feeds]
        self.output = self.p.get_output_handle(meta.fetch)

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        n = dense.shape[0]
        self.inputs[0].copy_from_cpu(dense)
        for s, h in enumerate(self.inputs[1:]):
            h.copy_from_cpu(np.ascontiguousarray(emb[s * n:(s + 1) * n]))
        self.p.run()
        return self.output.copy_to_cpu()


def export_here(tmp: Path) -> tuple[Path, np.ndarray]:
    """A version exported by the trainer's export with its default network (the head
    seeded, 20,000 embeddings of dim 9): ``(dense dir, values float32[m, 9])``."""
    rng = np.random.default_rng(0)
    keys = np.arange(1, 20001, dtype=np.uint64)
    values = rng.normal(0, 0.1, (len(keys), 9)).astype(np.float32)
    np.savez(tmp / "table.npz", keys=keys, values=values)
    subprocess.run([sys.executable, "-m", "runtime.trainer.export", "--root", str(tmp / "root"), "--version", "1",
                    "--table", str(tmp / "table.npz"), "--seed", "7"], check=True, capture_output=True, cwd=REPO,
                   env=dict(os.environ, GLOG_minloglevel="2"))
    return tmp / "root" / "versions" / "1" / "dense", values


def export_seconds(tmp: Path, n: int) -> list[float]:
    """Seconds of each of ``n`` versions published by one ``python -m runtime.trainer.export
    --repeat n`` process (the table of ``export_here``)."""
    r = subprocess.run([sys.executable, "-m", "runtime.trainer.export", "--root", str(tmp / "root-repeat"), "--version",
                        "100", "--table", str(tmp / "table.npz"), "--repeat", str(n)], check=True, capture_output=True,
                       text=True, cwd=REPO, env=dict(os.environ, GLOG_minloglevel="2"))
    return [float(ln.split()[1]) for ln in r.stdout.splitlines() if ln.startswith("export_seconds ")]


def session_options_table(path: Path, meta: ModelMeta, inputs: dict, runs: int) -> None:
    """CPU µs per run of ONNX Runtime sessions with other options than serving's, at each
    batch size: graph optimization level, two intra-op threads, arena and memory patterns
    off, and the ways of passing the inputs (``run`` with a dict, bound anew per run)."""
    import onnxruntime as ort

    from runtime.inference_onnx import session_options

    def session(**kw):
        so = session_options()
        for k, v in kw.items():
            setattr(so, k, v)
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def bound(sess, dense, emb):
        n = dense.shape[0]
        bd, be, bo = np.zeros_like(dense), np.zeros_like(emb), np.zeros((n, 1), np.float32)
        io = sess.io_binding()
        io.bind_cpu_input(meta.dense_feed, bd)
        for s, name in enumerate(meta.emb_feeds):
            io.bind_cpu_input(name, be[s * n:(s + 1) * n])
        io.bind_output(meta.fetch, "cpu", 0, np.float32, bo.shape, bo.ctypes.data)

        def run():
            bd[...] = dense
            be[...] = emb
            sess.run_with_iobinding(io)
            return bo.copy()
        return run

    def fed(sess, dense, emb):
        n = dense.shape[0]
        return lambda: sess.run([meta.fetch], {meta.dense_feed: dense, **{
            name: emb[s * n:(s + 1) * n] for s, name in enumerate(meta.emb_feeds)}})[0]

    def rebound(sess, dense, emb):
        n = dense.shape[0]
        io = sess.io_binding()
        bo = np.zeros((n, 1), np.float32)
        io.bind_output(meta.fetch, "cpu", 0, np.float32, bo.shape, bo.ctypes.data)

        def run():
            io.bind_cpu_input(meta.dense_feed, dense)
            for s, name in enumerate(meta.emb_feeds):
                io.bind_cpu_input(name, emb[s * n:(s + 1) * n])
            sess.run_with_iobinding(io)
            return bo.copy()
        return run

    L = ort.GraphOptimizationLevel
    variants = [
        ("serving's (all optimizations, 1 thread, arena, memory patterns, bound inputs)", {}, bound),
        ("graph optimization extended", {"graph_optimization_level": L.ORT_ENABLE_EXTENDED}, bound),
        ("graph optimization basic", {"graph_optimization_level": L.ORT_ENABLE_BASIC}, bound),
        ("graph optimization off", {"graph_optimization_level": L.ORT_DISABLE_ALL}, bound),
        ("2 intra-op threads", {"intra_op_num_threads": 2}, bound),
        ("CPU memory arena off", {"enable_cpu_mem_arena": False}, bound),
        ("memory patterns off", {"enable_mem_pattern": False}, bound),
        ("inputs passed to run() as a dict", {}, fed),
        ("inputs bound anew per run", {}, rebound),
    ]
    print("\nONNX Runtime session options (CPU µs per run; wall µs where it differs by over 10 %):")
    print("| options | " + " | ".join(f"batch {n}" for n in inputs) + " |")
    print("|---|" + "---:|" * len(inputs))
    for label, kw, how in variants:
        sess = session(**kw)
        cells = []
        for n, (dense, emb) in inputs.items():
            fn = how(sess, dense, emb)
            r = runs if n == 1 else max(10, runs // 10)
            c = cpu_us(fn, r)
            t0 = time.perf_counter()
            for _ in range(r):
                fn()
            w = (time.perf_counter() - t0) / r * 1e6
            cells.append(f"{c:.1f}" + (f" (wall {w:.1f})" if abs(w - c) > 0.1 * c else ""))
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version-dir", default=None, help="a published versions/<id>/dense (default: export one here)")
    ap.add_argument("--runs", type=int, default=2000, help="runs per pass at batch 1 (a tenth at 256; default 2000)")
    ap.add_argument("--batches", default="1,256", help="batch sizes (default 1,256)")
    ap.add_argument("--no-options", action="store_true", help="skip the session options table")
    ap.add_argument("--exports", type=int, default=6, help="versions published to time the export (default 6)")
    args = ap.parse_args()
    from runtime.inference import DensePredictor
    from runtime.inference_onnx import OnnxPredictor
    from runtime.trainer.onnx_export import sample_inputs

    with tempfile.TemporaryDirectory(prefix="bench-dense-") as tmp:
        if args.version_dir:
            d, values = Path(args.version_dir), np.zeros((0, 0), np.float32)
        else:
            d, values = export_here(Path(tmp))
        meta = ModelMeta.read(d)
        print(f"version {meta.version}: {meta.num_slots} slots, embedding {meta.embedding_dim}, layers "
              f"{'-'.join(map(str, meta.layers))}; model.onnx: {meta.onnx.converter if meta.onnx else '-'}, "
              f"opset {meta.onnx.opset if meta.onnx else '-'}, export check {meta.onnx.max_abs_diff if meta.onnx else '-'}"
              f"; {os.cpu_count()} CPUs", flush=True)
        onnx, paddle, defaults = OnnxPredictor(d, meta), DensePredictor(d, meta), PaddleDefaults(d, meta)
        inputs = {int(b): sample_inputs(meta, values, int(b), seed=int(b)) for b in args.batches.split(",")}
        print("\n| batch | max abs difference | ONNX Runtime, µs of CPU per run | Paddle Inference (serving's "
              "settings), µs | ratio | Paddle Inference (defaults: oneDNN, copies), µs | ratio |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        figures = {}
        for n, (dense, emb) in inputs.items():
            diff = max(float(np.abs(onnx.predict(dense, emb) - p.predict(dense, emb)).max()) for p in (paddle, defaults))
            r = args.runs if n == 1 else max(10, args.runs // 10)
            o = cpu_us(lambda: onnx.predict(dense, emb), r)
            p = cpu_us(lambda: paddle.predict(dense, emb), r)
            q = cpu_us(lambda: defaults.predict(dense, emb), r)
            figures[n] = (o, p, diff)
            print(f"| {n} | {diff:.1e} | {o:.1f} | {p:.1f} | {p / o:.1f}x | {q:.1f} | {q / o:.1f}x |", flush=True)
        if not args.no_options:
            session_options_table(meta.onnx_in(d), meta, inputs, args.runs)
        if not args.version_dir:
            export_s = export_seconds(Path(tmp), args.exports)
            print(f"\nexport with its ONNX copy, {args.exports} versions of 20,000 rows by one process: the first "
                  f"{export_s[0]:.2f} s (the converter child starting), then {float(np.median(export_s[1:])):.2f} s "
                  f"(median)")
    la = os.getloadavg()
    print(f"load average: {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs")
    line = " ".join(f"batch{n}_onnxruntime_us={o:.1f} batch{n}_paddle_us={p:.1f}" for n, (o, p, _) in figures.items())
    cost = (f" export_s_first={export_s[0]:.2f} export_s_p50={float(np.median(export_s[1:])):.2f}"
            if not args.version_dir else "")
    print(f"dense {line} max_abs_diff={max(x[2] for x in figures.values()):.1e}{cost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
