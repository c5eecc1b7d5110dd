"""Training benchmark (prints figures; not a test): examples/s of parameter-server
training (1 pserver x 2 trainers, local processes) vs single process, and export time,
on 1M generated examples (cached under .bench/, ignored by git).

Usage: .venv/bin/python bench/bench_train.py [--rows 1000000] [--epochs 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(args: list[str]) -> dict:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", *args], capture_output=True, text=True,
                       cwd=REPO)
    wall = time.monotonic() - t0
    for line in r.stdout.splitlines():
        if line.startswith("ELASTIC_CTR_SUMMARY "):
            rec = json.loads(line.split(" ", 1)[1])
            rec["wall_s"] = round(wall, 1)
            return rec
    raise SystemExit(f"train failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--test-rows", type=int, default=50_000)
    ap.add_argument("--epochs", type=int, default=1)
    a = ap.parse_args()
    data = REPO / ".bench" / f"train-{a.rows}-{a.test_rows}"
    if not (data / "signal.json").exists():
        from runtime.trainer import generator

        print(f"generating {a.rows} rows into {data} ...", flush=True)
        generator.generate(data, a.rows, a.test_rows, seed=1)
    sig = json.loads((data / "signal.json").read_text())
    common = ["--data-train", str(data / "train.txt"), "--data-test", str(data / "test.txt"),
              "--epochs", str(a.epochs)]
    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    single = _run(["--single", *common, "--output", str(out / "single")])
    ps = _run(["--local-cluster", "--pservers", "1", "--trainers", "2", *common, "--output", str(out / "ps")])
    print(f"\ntraining benchmark: {a.rows} examples x {a.epochs} epoch(s), batch 512, dim 9, layers 128,64,32")
    print(f"generator true-logit test AUC: {sig['true_logit_auc_test']:.4f}")
    print(f"{'mode':<22}{'examples/s':>12}{'train s':>10}{'export s':>10}{'wall s':>9}{'test AUC':>10}")
    for name, r in (("single process", single), ("PS 1 pserver x 2", ps)):
        rate = r.get("examples_per_s_total") or r["examples_per_s"]
        print(f"{name:<22}{rate:>12.0f}{r['train_seconds']:>10.1f}{r.get('export_seconds', 0):>10.2f}"
              f"{r['wall_s']:>9.1f}{r['test_auc'][-1]:>10.4f}")


if __name__ == "__main__":
    main()
