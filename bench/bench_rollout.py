"""Rollout time: donefile line -> every instance of S shards x R replicas enabled.

Starts, as processes on 127.0.0.1, a file server, S x R cube servers + agents and the
transfer (``runtime.cube.cluster.LocalCubeCluster``; the transfer reads ROOT
through the file server: JSON listing, input download, token PUT of the shard tars;
agents download over HTTP). Writes one version of ``--keys`` random uint64 keys x
``--dim`` float32 as SequenceFiles (the trainer's export layout), then appends its
donefile line and measures the wall time (s) until the transfer's ``/dict/info`` reports
that version served by every instance. The transfer polls the donefile every
``--poll-interval`` s, which is part of the measured time.

Prints the transfer's phase durations, the value checks of a sample of keys, and one line:
``rollout keys=<n> shards=<S> replicas=<R> seconds=<s>`` (target on the 2-core machine: <= 15 s
for 1M keys x 10 float32, 2 x 2).

Usage: ``python bench/bench_rollout.py [--keys 1000000 --dim 10 --shards 2 --replicas 2]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.cube.cluster import LocalCubeCluster  # noqa: E402
from runtime.cube.client import CubeClient  # noqa: E402
from runtime.formats.seqfile import write_sequence_file  # noqa: E402


def run_rollout_bench(keys: int = 1_000_000, dim: int = 10, shards: int = 2, replicas: int = 2,
                      parts: int = 4, poll_interval_s: float = 0.2, workdir: str | None = None,
                      seed: int = 0) -> dict:
    """Runs the measurement; returns ``{"keys", "dim", "shards", "replicas", "seconds",
    "phases" (s per phase, from the transfer's history), "transfer_seconds"}``.
    Raises ``AssertionError`` if the sampled values read back through CubeClient differ."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="bench_rollout_"))
    try:
        rng = np.random.default_rng(seed)
        k = np.unique(rng.integers(1, 1 << 63, keys + keys // 100, dtype=np.uint64))[:keys]
        rng.shuffle(k)
        v = rng.standard_normal((len(k), dim)).astype(np.float32)
        root = tmp / "root"
        vid = int(time.time())
        sparse = root / "versions" / str(vid) / "sparse"
        sparse.mkdir(parents=True)
        for i, sl in enumerate(np.array_split(np.arange(len(k)), parts)):
            write_sequence_file(sparse / f"part-{i:05d}", k[sl], v[sl])
        with LocalCubeCluster(tmp / "run", root, shards=shards, replicas=replicas,
                              poll_interval_s=poll_interval_s) as c:
            t0 = time.monotonic()
            c.publish_version(vid, vid, dim=dim, count=len(k))
            t1 = c.wait_version(vid, timeout_s=300, poll_s=0.02)
            seconds = t1 - t0
            hist = requests.get(f"{c.transfer_url}/dict/deploy/history", timeout=5).json()["history"]
            last = hist[-1]
            with CubeClient.from_topology(c.topology, timeout_ms=5000) as client:
                idx = rng.choice(len(k), 10_000, replace=False)
                res = client.seek(k[idx])
                assert res.version == vid and res.found.all(), "keys missing after the rollout"
                np.testing.assert_array_equal(res.values, v[idx])
        return {"keys": len(k), "dim": dim, "shards": shards, "replicas": replicas,
                "seconds": round(seconds, 3), "phases": last.get("phases"),
                "transfer_seconds": last.get("seconds")}
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--parts", type=int, default=4, help="SequenceFile part files (default 4)")
    ap.add_argument("--poll-interval", type=float, default=0.2, help="transfer donefile poll (s)")
    args = ap.parse_args()
    r = run_rollout_bench(args.keys, args.dim, args.shards, args.replicas, args.parts, args.poll_interval)
    print("transfer phases (s):", json.dumps(r["phases"]), "transfer total (s):", r["transfer_seconds"])
    print(f"rollout keys={r['keys']} shards={r['shards']} replicas={r['replicas']} seconds={r['seconds']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
