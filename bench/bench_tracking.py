"""Tracking overhead benchmark (prints figures; not a test): the same continuous training job
(single process, one math thread, hourly partitions of generated data) run without
tracking, logging to a real ``mlflow server`` on 127.0.0.1 (``runtime.local.mlflow_server``),
and logging to a server that is down (nothing listens; every request fails at once and is
retried in the background), in alternating order.

Figures per setting: the job's wall seconds (process start to exit, including the final
flush of the tracker: ``Tracker.close``, bounded by ``runtime.tracking.CLOSE_TIMEOUT_S``),
its training examples/s (the summary's ``examples_per_s``: examples over seconds inside the
passes) and the median of each over ``--repeats`` runs; and the cost of one
``Tracker.log_metrics`` call on the training thread (it only enqueues) with the rate the
background thread delivers events to the server. On a loaded machine the job figures vary
by more than tracking could cost: compare medians of several repeats.

Usage: .venv/bin/python bench/bench_tracking.py [--hours 4] [--rows 20000] [--repeats 2]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime import proc  # noqa: E402
from runtime.formats.train_result import SUMMARY, TrainResult  # noqa: E402
from runtime.local.mlflow_server import MlflowServer  # noqa: E402
from runtime.trainer import generator  # noqa: E402

START = "20261120/00"


def run_job(root: Path, work: Path, hours: int, uri: str | None) -> tuple[float, float]:
    """(wall seconds, examples/s) of one continuous job over ``hours`` partitions."""
    from runtime import role_specs
    from runtime.trainer.config import TrainConfig

    cfg = TrainConfig(mode="continuous", data_root=str(root), start_hour=START, end_hour=generator_hour(hours - 1),
                      state_dir=str(work / "state"), output=str(work / "out"), poll_seconds=0.2, threads=1)
    launch = ["--single", *(["--tracking-uri", uri] if uri else [])]
    args = [sys.executable, "-m", "runtime.cli", *role_specs.train_argv(cfg, launch)]
    t0 = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, cwd=REPO,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    wall = time.monotonic() - t0
    rec = TrainResult.find(r.stdout, SUMMARY, source="train stdout")
    if r.returncode != 0 or rec is None:
        raise SystemExit(f"job failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return wall, float(rec.examples_per_s)


def call_cost(uri: str, n: int = 5000) -> tuple[float, float]:
    """(microseconds per ``log_metrics`` call on the caller's thread, events/s the
    background thread delivers) for ``n`` calls against the server at ``uri``."""
    from runtime import tracking

    tr = tracking.Tracker(uri, "bench-calls", queue_size=n + 10)
    t0 = time.perf_counter()
    for i in range(n):
        tr.log_metrics({"auc": 0.5, "loss": 0.1, "rows": i}, step=i)
    per_call = (time.perf_counter() - t0) / n * 1e6
    t1 = time.perf_counter()
    tr.wait_idle(600)
    rate = n / (time.perf_counter() - t1)
    tr.close()
    return per_call, rate


def generator_hour(i: int) -> str:
    from runtime.formats.partitions import Hour

    return str(Hour.parse(START).next(i))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=int, default=4)
    ap.add_argument("--rows", type=int, default=20000, help="rows per hourly partition")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        tmp = Path(tmp)
        generator.generate_hours(tmp / "data", a.hours, START, a.rows, seed=3)
        with proc.ProcessGroup(tmp / "logs") as group:
            server = MlflowServer(tmp / "mlflow", group).start()
            settings = {"off": None, "mlflow server": server.url, "server down": "http://127.0.0.1:9"}
            calls = call_cost(server.url)
            res: dict[str, list[tuple[float, float]]] = {k: [] for k in settings}
            for i in range(a.repeats):
                for name, uri in settings.items():
                    res[name].append(run_job(tmp / "data", tmp / f"{name.replace(' ', '-')}-{i}", a.hours, uri))
                    print(f"run {i + 1} {name:>14}: wall {res[name][-1][0]:6.2f} s, "
                          f"{res[name][-1][1]:9.1f} examples/s", flush=True)
    print(f"\nTracker.log_metrics on the training thread: {calls[0]:.1f} us per call (3 metrics, enqueue only); "
          f"the thread delivered {calls[1]:.0f} events/s to the server")
    base_wall = statistics.median(w for w, _ in res["off"])
    base_eps = statistics.median(e for _, e in res["off"])
    print(f"\ncontinuous job, {a.hours} partitions x {a.rows} rows, single process, medians of {a.repeats}:")
    for name, rows in res.items():
        wall, eps = statistics.median(w for w, _ in rows), statistics.median(e for _, e in rows)
        print(f"  {name:>14}: wall {wall:6.2f} s ({wall - base_wall:+.2f} s), training {eps:9.1f} examples/s "
              f"({(eps / base_eps - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
