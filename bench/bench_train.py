"""Training benchmark (prints figures; not a test): parameter-server training (1 pserver x 2
trainers, local processes; ``--ps-mode`` async, async-merged and geo) vs a single process, both on Paddle's dataset path, on 1M
generated examples (cached under .bench/, ignored by git), plus the bytes each trainer
sends to and receives from the pserver per 1000 examples (TCP payload bytes of its
connections to the pserver port, sampled with iproute2's ``ss -ti`` every 0.25 s).

examples/s: examples trained / seconds in ``train_from_dataset`` (the PS job: every
trainer's examples over the slowest trainer's time); "with load" adds the time to parse
and load the data.

Usage: .venv/bin/python bench/bench_train.py [--rows 1000000] [--epochs 1]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime.formats import signal  # noqa: E402
from runtime.formats.train_result import RESULT, SUMMARY, TrainResult  # noqa: E402

def _run_single(cfg) -> dict:
    """The single-process run of ``cfg`` (a ``TrainConfig``): its summary record and ``wall_s``."""
    from runtime import role_specs

    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", *role_specs.train_argv(cfg, ["--single"])],
                       capture_output=True, text=True, cwd=REPO)
    wall = time.monotonic() - t0
    found = TrainResult.find(r.stdout, SUMMARY, source="train --single stdout")
    if found is not None:
        rec = found.to_dict()
        rec["wall_s"] = round(wall, 1)
        return rec
    raise SystemExit(f"train failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


class SocketSampler:
    """Samples the TCP byte counters of the trainers' connections to the pservers."""

    def __init__(self, period_s: float = 0.25):
        self.period_s = period_s
        self.max: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, local port) -> (sent, received)
        self.ports: set[int] = set()
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = shutil.which("ss") is not None

    def start(self, endpoints: list[str], pids: list[int]) -> None:
        self.ports = {int(e.rpartition(":")[2]) for e in endpoints}
        self.pids = set(pids)
        if self.available:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        for port in self.ports:
            out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{port} )"],
                                 capture_output=True, text=True).stdout
            cur = None
            for line in out.splitlines():
                if not line.startswith(("\t", " ")):
                    m = re.search(r":(\d+)\s+\S+:(\d+)\s", line + " ")
                    pm = re.search(r"pid=(\d+)", line)
                    cur = (int(pm.group(1)), int(m.group(1))) if m and pm else None
                elif cur and cur[0] in self.pids:
                    bs = re.search(r"bytes_sent:(\d+)", line)
                    br = re.search(r"bytes_received:(\d+)", line)
                    new = (int(bs.group(1)) if bs else 0, int(br.group(1)) if br else 0)
                    old = self.max.get(cur, (0, 0))
                    self.max[cur] = (max(old[0], new[0]), max(old[1], new[1]))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period_s)

    def stop(self) -> dict[int, tuple[int, int]]:
        """{trainer pid: (bytes sent, bytes received)} summed over its connections."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        out: dict[int, tuple[int, int]] = {}
        for (pid, _), (s, r) in self.max.items():
            a, b = out.get(pid, (0, 0))
            out[pid] = (a + s, b + r)
        return out


def _run_ps(data: Path, out: Path, epochs: int, threads: int, ps_mode: str) -> tuple[dict, list]:
    from runtime.local.ps import run_local_ps
    from runtime.trainer.config import TrainConfig

    cfg = TrainConfig(data_train=[str(data / "train.txt")], data_test=[str(data / "test.txt")], epochs=epochs,
                      threads=threads, output=str(out), ps_mode=ps_mode)
    sampler = SocketSampler()
    order: list[int] = []

    def started(endpoints, pids):
        order.extend(pids)
        sampler.start(endpoints, pids)

    t0 = time.monotonic()
    rec = run_local_ps(cfg, 1, 2, log_dir=str(out.parent / f"ps-logs-{ps_mode}"), on_started=started)
    rec["wall_s"] = round(time.monotonic() - t0, 1)
    traffic = sampler.stop()
    per = []
    logs = Path(rec["log_dir"])
    for i, pid in enumerate(order):
        res = TrainResult.find((logs / f"trainer-{i}.log").read_text(errors="replace"), RESULT,
                               source=f"trainer-{i}.log")
        examples = (res.examples or 0) if res is not None else 0
        sent, recv = traffic.get(pid, (0, 0))
        per.append({"trainer": i, "examples": examples, "sent": sent, "received": recv})
    return rec, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--test-rows", type=int, default=50_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="dataset threads per trainer (and single)")
    ap.add_argument("--ps-modes", default="async,async-merged,geo",
                    help="comma-separated --ps-mode values to run (the first is the headline row)")
    a = ap.parse_args()
    data = REPO / ".bench" / f"train-{a.rows}-{a.test_rows}"
    if not (data / "signal.json").exists():
        from runtime.trainer import generator

        print(f"generating {a.rows} rows into {data} ...", flush=True)
        generator.generate(data, a.rows, a.test_rows, seed=1)
    sig = signal.read_split(data)
    from runtime.trainer.config import TrainConfig

    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        single = _run_single(TrainConfig(data_train=[str(data / "train.txt")], data_test=[str(data / "test.txt")],
                                         epochs=a.epochs, threads=a.threads, output=str(out / "single")))
        runs = {m: _run_ps(data, out / f"ps-{m}", a.epochs, a.threads, m) for m in a.ps_modes.split(",")}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"\ntraining benchmark: {a.rows} examples x {a.epochs} epoch(s), batch 512, dim 9, layers 128,64,32, "
          f"dataset threads {a.threads}, on the dataset path (InMemoryDataset + train_from_dataset)")
    print(f"generator true-logit test AUC: {sig.true_logit_auc_test:.4f}")
    print(f"{'mode':<20}{'examples/s':>12}{'with load':>11}{'train s':>9}{'load s':>8}{'export s':>10}"
          f"{'wall s':>8}{'test AUC':>10}")
    rows = [("single process", single, single["examples_per_s"], single["examples_per_s_with_load"])]
    rows += [(f"PS 1x2 {m}", r, r["examples_per_s_total"], r["examples_per_s_with_load_total"])
             for m, (r, _) in runs.items()]
    for name, r, rate, rate_load in rows:
        print(f"{name:<20}{rate:>12.0f}{rate_load:>11.0f}{r['train_seconds']:>9.1f}{r['load_seconds']:>8.1f}"
              f"{r.get('export_seconds', 0):>10.2f}{r['wall_s']:>8.1f}{r['test_auc'][-1]:>10.4f}")
    headline = a.ps_modes.split(",")[0]
    ps = runs[headline][0]
    ps_rate, single_rate = ps["examples_per_s_total"], single["examples_per_s"]
    print("\nPS traffic per trainer (TCP payload to/from the pserver port, whole job incl. start, "
          "trainer 0's test evaluation and the save):")
    if not shutil.which("ss"):
        print("  n/a: iproute2's ss is not installed")
    for m, (_, traffic) in runs.items():
        for t in traffic:
            k = max(t["examples"], 1) / 1000
            print(f"  {m:<13} trainer {t['trainer']}: {t['examples']} examples, sent {t['sent'] / 1e6:.1f} MB "
                  f"({t['sent'] / 1024 / k:.0f} KB per 1000 examples), received {t['received'] / 1e6:.1f} MB "
                  f"({t['received'] / 1024 / k:.0f} KB per 1000 examples)")
    ps_auc, single_auc = ps["test_auc"][-1], single["test_auc"][-1]
    print(f"train ps_vs_single={ps_rate / single_rate:.3f} ps_examples_s={ps_rate:.0f} "
          f"single_examples_s={single_rate:.0f} ps_auc={ps_auc:.4f} auc_gap={abs(ps_auc - single_auc):.4f}")


if __name__ == "__main__":
    main()
