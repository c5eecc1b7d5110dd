"""What checking a version against its manifest and building a rollback's chain cost
(docs/rollback.md): one SequenceFile part of ``--rows`` rows (``--dim`` floats each) is
written, its manifest entry built (size, SHA-256, rows) and checked again as the transfer
checks a downloaded part (``runtime.formats.manifest.verify_file``); then the chain of a
base of that part and ``--patches`` patches of ``--patch-rows`` rows is built as one base
for ``--shards`` shards (``runtime.cube.builder.build``, what a rollback builds). Prints
one line: ``manifest rows=<n> bytes=<b> sha256_s=<s> verify_s=<s> chain_keys=<n>
chain_build_s=<s>`` (best of ``--repeat``).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.cube.builder import build  # noqa: E402
from runtime.formats import manifest  # noqa: E402
from runtime.formats.seqfile_writer import write_sequence_file  # noqa: E402


def best(fn, repeat: int) -> float:
    """The fastest of ``repeat`` wall-clock runs of ``fn()`` (s)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rows", type=int, default=1 << 20, help="rows of the base part")
    ap.add_argument("--dim", type=int, default=9, help="floats per row")
    ap.add_argument("--patches", type=int, default=3, help="patches in the chain")
    ap.add_argument("--patch-rows", type=int, default=100_000, help="rows per patch")
    ap.add_argument("--shards", type=int, default=2, help="shards the chain is built for")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        base = Path(tmp) / "part-00000"
        keys = rng.choice(1 << 62, args.rows, replace=False).astype(np.uint64)
        write_sequence_file(base, keys, rng.standard_normal((args.rows, args.dim)).astype(np.float32))
        entry = manifest.FileEntry(path="sparse/part-00000", bytes=base.stat().st_size,
                                   sha256=manifest.sha256_file(base), rows=args.rows)
        sha_s = best(lambda: manifest.sha256_file(base), args.repeat)
        verify_s = best(lambda: manifest.verify_file(entry, base, str(base)), args.repeat)
        parts = [str(base)]
        for i in range(args.patches):
            pk = np.concatenate([rng.choice(keys, args.patch_rows // 2, replace=False),
                                 rng.choice(1 << 62, args.patch_rows - args.patch_rows // 2).astype(np.uint64)])
            p = Path(tmp) / f"patch-{i}"
            write_sequence_file(p, pk, rng.standard_normal((len(pk), args.dim)).astype(np.float32))
            parts.append(str(p))
        rec = {}

        def chain():
            rec["r"] = build(parts, Path(tmp) / "out", "d", args.shards, version=int(time.time_ns() % 10**9))

        build_s = best(chain, args.repeat)
    print(f"manifest rows={args.rows} bytes={entry.bytes} sha256_s={sha_s:.3f} verify_s={verify_s:.3f} "
          f"chain_keys={rec['r'].count} chain_build_s={build_s:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
