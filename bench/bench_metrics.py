"""What serving's per-request metrics cost, in isolation (``make bench-metrics``): the
updates one inference request makes (``runtime.metrics.serving.ServingMetrics``: the
request counter and latency histogram it always had, and the in-flight gauge and the
samples-per-request and per-model-run histograms added for monitoring), timed in one
process and in prometheus_client's multiprocess mode (serving's: every update writes a
memory-mapped file), beside the cost of one ``/metrics`` scrape of a cube server
(``runtime.metrics.cube``: read from its counters, nothing on the lookup path).

Prints a table and ``metrics old_us=<a> added_us=<b> added_mp_us=<c>`` (microseconds per
request: the old updates, the added ones, the added ones in multiprocess mode).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(fn, n: int) -> float:
    """Microseconds per call of ``fn`` (best of 3 runs of ``n`` calls)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def measure(n: int) -> dict[str, float]:
    """``{"old", "added"}``: microseconds per request in this process's mode."""
    from runtime.metrics.serving import ServingMetrics

    m = ServingMetrics()

    def old():
        m.observe("infer", 200, 0.001)
        m.runs.inc()
        m.samples.inc(1)

    def added():
        m.request_samples.observe(1)
        m.inflight.inc()
        m.inflight.dec()
        m.batch_samples.observe(1)

    return {"old": _time(old, n), "added": _time(added, n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000, help="updates timed per run (default 20000)")
    a = ap.parse_args(argv)
    single = measure(a.requests)
    with tempfile.TemporaryDirectory() as d:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = d
        multi = measure(a.requests)
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    from runtime.cube.server.core import CubeServer
    from runtime.metrics import exposition
    from runtime.metrics.cube import server_registry

    reg = server_registry(CubeServer(0, 1, "bench", host="127.0.0.1", port=0, http_port=0))
    scrape_us = _time(lambda: exposition(reg), 200)
    print("| updates per request | one process us | multiprocess us |\n|---|---:|---:|")
    print(f"| old (requests, latency, runs, samples) | {single['old']:.2f} | {multi['old']:.2f} |")
    print(f"| added (in-flight inc/dec, samples per request and per run) | {single['added']:.2f} | "
          f"{multi['added']:.2f} |")
    print(f"cube server /metrics exposition: {scrape_us:.0f} us per scrape (nothing on the lookup path)")
    print(f"metrics old_us={single['old']:.2f} added_us={single['added']:.2f} added_mp_us={multi['added']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
