"""Read throughput of one hourly partition from an S3-protocol server vs a local file.

Writes a ``--rows`` (50 000) Criteo-row partition with the data generator
(``runtime.trainer.generator.generate_hours``), uploads it to a moto S3 server started on
127.0.0.1 for the run (tests/s3server.py; stopped by PID at the end), and reads it
``--repeats`` times each way through ``runtime.storage``:

- ``bytes``: ``open_stream`` read to the end in 1 MiB chunks (the transfer's and agents'
  download path);
- ``lines``: ``iter_lines`` (what the trainer's staging streams);
- ``rows``: ``runtime.trainer.readers.iter_batches`` parsing every row (the trainer's reader).

Prints one line per (source, way) with the best of the repeats:
``storage source=<local|s3> way=<bytes|lines|rows> bytes=<n> rows=<n> seconds=<s> MB_per_s=<x> rows_per_s=<x>``.
moto is a Python server on the same 2 cores: its figures are a floor for a real store,
not an estimate of one.

Usage: ``python bench/bench_storage.py [--rows 50000 --repeats 3]``
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import storage, storage_write  # noqa: E402
from runtime.formats import partitions  # noqa: E402
from runtime.trainer import generator, readers  # noqa: E402
from tests.s3server import S3Server  # noqa: E402


def _read_bytes(loc: str) -> tuple[int, int]:
    n = 0
    with storage.open_stream(loc) as f:
        for chunk in iter(lambda: f.read(storage.CHUNK), b""):
            n += len(chunk)
    return n, 0


def _read_lines(loc: str) -> tuple[int, int]:
    rows = sum(1 for _ in storage.iter_lines(loc))
    return 0, rows


def _read_rows(loc: str) -> tuple[int, int]:
    rows = sum(len(b) for b in readers.iter_batches([loc], batch_size=4096))
    return 0, rows


WAYS = {"bytes": _read_bytes, "lines": _read_lines, "rows": _read_rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp, S3Server(tmp) as s3:
        os.environ.update(s3.env())
        root = Path(tmp) / "hours"
        generator.generate_hours(root, 1, "20261120/00", args.rows)
        hour = partitions.Hour.parse("20261120/00")
        local = partitions.files(str(root), hour)[0]
        size = os.path.getsize(local)
        remote_root = f"s3://{s3.new_bucket()}/hours"
        storage_write.upload_tree(Path(hour.location(str(root))), hour.location(remote_root))
        remote = partitions.files(remote_root, hour)[0]
        print(f"partition: {args.rows} rows, {size} bytes; local {local}; s3 {remote} ({s3.endpoint})")
        for way, fn in WAYS.items():
            for source, loc in (("local", local), ("s3", remote)):
                best, rows = None, 0
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    _, rows = fn(loc)
                    dt = time.perf_counter() - t
                    best = dt if best is None else min(best, dt)
                if way != "bytes" and rows != args.rows:
                    raise SystemExit(f"{source} {way}: read {rows} rows, expected {args.rows}")
                print(f"storage source={source} way={way} bytes={size} rows={args.rows} seconds={best:.4f} "
                      f"MB_per_s={size / best / 1e6:.1f} rows_per_s={args.rows / best:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
