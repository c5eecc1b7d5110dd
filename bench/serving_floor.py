"""The floor of a serving request: what the model run and the cube lookups of one batch cost
with no server around them (no HTTP, no decoding, validation or encoding), for the serving
benchmarks to print next to serving's CPU per request.

``measure_floor`` builds this process's own data plane over a running cube
(``runtime.serving.launcher.build_dataplane``, as every serving worker does) and times, per
batch of ``rows``: the cube lookups alone (``CtrModel._seek`` of the batch's feasigns,
slot-major, pinned to the version), the model run alone (``DenseModel.predict`` on the
normalized dense features and the looked-up embeddings), and both as serving runs them
(``CtrModel._predict``: normalization, lookups, zeroed misses, predictor). Figures are this
process's CPU time (``time.process_time``: every thread, Paddle's included) and wall time
per batch, in milliseconds.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np


def _per_call(fn, reps: int) -> tuple[float, float]:
    """``(cpu_ms, wall_ms)`` per call of ``fn`` over ``reps`` calls."""
    c0, w0 = time.process_time(), time.perf_counter()
    for k in range(reps):
        fn(k)
    return (time.process_time() - c0) * 1e3 / reps, (time.perf_counter() - w0) * 1e3 / reps


def measure_floor(plane: Any, dense: np.ndarray, feasigns: np.ndarray, batches: list[int],
                  reps: int = 200, warmup: int = 10) -> dict[int, dict[str, float]]:
    """Floor figures per batch size.

    Args:
        plane: a ``DataPlane`` whose default model is ``CtrModel`` with a version loaded.
        dense: float32[n,13] raw dense features (NaN = missing); feasigns: uint64[n,S].
        batches: batch sizes (each <= n); batch k of a size takes rows k*b.. cycling.
        reps: calls timed per figure; warmup: calls before timing.
    Returns ``{batch: {"lookup_cpu_ms", "lookup_wall_ms", "model_cpu_ms", "model_wall_ms",
    "floor_cpu_ms", "floor_wall_ms"}}`` (per batch). Raises ``ValueError`` for a batch
    larger than the rows, ``runtime.serving.protocol.Unavailable`` when no version is loaded
    or the cube fails."""
    from runtime.formats import features

    ctr = plane.default
    model = ctr.current()
    n = feasigns.shape[0]
    out: dict[int, dict[str, float]] = {}
    for b in batches:
        if not 0 < b <= n:
            raise ValueError(f"batches: {b} is not within the {n} rows given")
        starts = list(range(0, n - b + 1, b))
        parts = [(dense[s:s + b], feasigns[s:s + b]) for s in starts]
        keys = [np.ascontiguousarray(f.T).ravel() for _, f in parts]
        norm = [features.normalize_dense(d, model.meta.normalization.clip_max) for d, _ in parts]
        embs = []
        for k in keys:
            res = ctr._seek(k, model.version)
            v = np.ascontiguousarray(res.values, dtype=np.float32).copy()
            if res.found is not None:
                v[~res.found] = 0.0
            embs.append(v)
        m = len(parts)

        def lookup(k):
            ctr._seek(keys[k % m], model.version)

        def run(k):
            model.predict(norm[k % m], embs[k % m])

        def both(k):
            ctr._predict(model, parts[k % m][0], parts[k % m][1])

        fig: dict[str, float] = {}
        for name, fn in (("lookup", lookup), ("model", run), ("floor", both)):
            for k in range(warmup):
                fn(k)
            fig[f"{name}_cpu_ms"], fig[f"{name}_wall_ms"] = _per_call(fn, reps)
        out[b] = fig
    return out
