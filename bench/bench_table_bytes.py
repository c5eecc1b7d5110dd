"""What a row of the parameter servers' sparse table costs in memory, admitted or not (the
figures ``infra.config_lifecycle`` sizes ``pserverMemory`` from: docs/training.md "Sizing the
table").

One pserver (``elastic-ctr train`` in the PSERVER role, ``--feature-min-count 2``,
``--embedding-dim`` as given) and this process as its one trainer (``PsWorker``, the job's
programs): ``--keys`` distinct feasigns are pushed once (each then has a row without its
embedding: not admitted), then a second time (admitted: the accessor adds the embedding and
its Adam state). The pserver's resident memory (``VmRSS``) is read before, after each pass,
and per row. Last line::

    table_bytes dim=<n> keys=<n> pserver_base_mib=<n> counted_row_bytes=<n> admitted_row_bytes=<n>

Usage: ``python bench/bench_table_bytes.py [--keys 1000000 --embedding-dim 9]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_rollout import rss_mib  # noqa: E402
from runtime import proc  # noqa: E402
from runtime.trainer import PADDLE_FLAGS, set_paddle_flags  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct feasigns pushed")
    ap.add_argument("--embedding-dim", type=int, default=9)
    ap.add_argument("--batch", type=int, default=4096, help="rows per push (26 feasigns each)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_table_bytes_"))
    data = work / "rows.txt"
    data.write_text("0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["0a"] * 26) + "\n")
    flags = ["--data-train", str(data), "--embedding-dim", str(args.embedding_dim), "--feature-min-count", "2"]
    port, gloo = proc.free_ports(2)
    env = {**os.environ, **PADDLE_FLAGS, "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}",
           "PADDLE_TRAINERS_NUM": "1", "POD_IP": "127.0.0.1", "PADDLE_PORT": str(port), "PADDLE_GLOO_PORT": str(gloo),
           "OMP_NUM_THREADS": "1", "CPU_NUM": "1"}
    ps = subprocess.Popen(proc.self_command() + ["train", *flags], env={**env, "TRAINING_ROLE": "PSERVER"},
                          stdout=subprocess.DEVNULL, stderr=open(work / "pserver.log", "w"))
    try:
        os.environ.update({**env, "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0"})
        set_paddle_flags()
        out = measure(args, flags, ps.pid)
    finally:
        ps.terminate()
        ps.wait(30)
    print(f"pserver: {out['base']:.0f} MiB before any row; {out['counted']:.0f} MiB after {args.keys} keys pushed once, "
          f"{out['admitted']:.0f} MiB after twice")
    counted = (out["counted"] - out["base"]) * 2**20 / args.keys
    admitted = (out["admitted"] - out["base"]) * 2**20 / args.keys
    print(f"table_bytes dim={args.embedding_dim} keys={args.keys} pserver_base_mib={out['base']:.0f} "
          f"counted_row_bytes={counted:.0f} admitted_row_bytes={admitted:.0f}", flush=True)
    return 0


def measure(args, flags: list[str], pserver_pid: int) -> dict:
    """This process as the trainer: pushes every key twice, reads the pserver's RSS (MiB)."""
    import paddle
    from paddle.distributed import fleet

    from runtime.trainer import datafeed, roles
    from runtime.trainer.config import TrainConfig
    from runtime.trainer.ps_worker import PsWorker

    role = roles.from_env()
    roles.apply(role)
    paddle.enable_static()
    fleet.init(is_collective=False)
    cfg = TrainConfig(data_train=[flags[1]], embedding_dim=args.embedding_dim, feature_min_count=2)
    worker = PsWorker(cfg, role)
    S = len(worker.slots)
    keys = np.arange(1, args.keys + 1, dtype=np.int64)
    out = {"base": rss_mib(pserver_pid, "VmRSS")}
    for name in ("counted", "admitted"):
        for s in range(0, len(keys), args.batch * S):
            chunk = keys[s:s + args.batch * S]
            rows = -(-len(chunk) // S)
            ids = np.resize(chunk, rows * S).reshape(S, rows).T
            feed = {datafeed.DENSE_VAR: np.zeros((rows, 13), np.float32),
                    datafeed.LABEL_VAR: np.zeros((rows, 1), np.int64)}
            for i in range(S):
                feed[datafeed.slot_var(i)] = np.ascontiguousarray(ids[:, i:i + 1])
            worker.exe.run(worker.main, feed=feed, fetch_list=[])
        worker.sync()
        time.sleep(1.0)
        out[name] = rss_mib(pserver_pid, "VmRSS")
    worker.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
