"""Hourly partitions and donefiles on an S3-protocol server (moto on loopback): a partition
counts only once its ``_SUCCESS`` object exists, the continuous job's wait polls for it, and
a donefile publisher killed mid-append neither loses nor duplicates a line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from runtime import storage, storage_write
from runtime.formats import donefile, partitions


def _put(loc: str, data: bytes, tmp_path) -> None:
    f = tmp_path / "obj"
    f.write_bytes(data)
    storage_write.upload(f, loc)


def test_partition_counts_only_once_its_success_object_exists(s3_bucket, tmp_path):
    root = f"{s3_bucket}/hours"
    h = partitions.Hour.parse("20261120/00")
    assert h.location(root) == f"{root}/20261120/00"
    _put(f"{root}/20261120/00/part-00000", b"0\t1\n", tmp_path)
    _put(f"{root}/20261120/00/part-00001", b"1\t2\n", tmp_path)
    assert not partitions.is_complete(root, h)
    with pytest.raises(partitions.PartitionError, match=rf"20261120/00 \({root}/20261120/00\) is not complete"):
        partitions.files(root, h)
    _put(f"{root}/20261120/00/_SUCCESS", b"", tmp_path)
    assert partitions.is_complete(root, h)
    assert partitions.files(root, h) == [f"{root}/20261120/00/part-00000", f"{root}/20261120/00/part-00001"]
    # a marker with no data file is an error naming the partition
    h1 = h.next()
    _put(f"{root}/20261120/01/_SUCCESS", b"", tmp_path)
    with pytest.raises(partitions.PartitionError, match="20261120/01.*holds no data file"):
        partitions.files(root, h1)


def test_minute_partition_on_the_object_store(s3_bucket, tmp_path):
    root = f"{s3_bucket}/minutes"
    p = partitions.Partition.parse("20261120/2359", minutes=1)
    _put(f"{root}/20261120/2359/part-00000", b"0\t1\n", tmp_path)
    _put(f"{root}/20261121/0000/part-00000", b"1\t2\n", tmp_path)
    _put(f"{root}/20261120/2359/_SUCCESS", b"", tmp_path)
    assert partitions.is_complete(root, p) and not partitions.is_complete(root, p.next())
    assert partitions.files(root, p) == [f"{root}/20261120/2359/part-00000"]
    _put(f"{root}/20261121/0000/_SUCCESS", b"", tmp_path)
    assert partitions.files(root, p.next()) == [f"{root}/20261121/0000/part-00000"]


def test_continuous_wait_polls_until_success_lands(s3_bucket, tmp_path):
    """online._wait_for (the continuous job's wait) returns only after _SUCCESS lands."""
    from runtime.trainer import online

    root = f"{s3_bucket}/hours"
    h = partitions.Hour.parse("20261120/05")
    _put(f"{root}/20261120/05/part-00000", b"0\t1\n", tmp_path)

    class Cfg:
        data_root, poll_seconds = root, 0.1

    class Stop:
        requested = False

    landed = []

    def land():
        time.sleep(1.0)
        _put(f"{root}/20261120/05/_SUCCESS", b"", tmp_path)
        landed.append(time.monotonic())

    t = threading.Thread(target=land)
    t.start()
    assert online._wait_for(Cfg, h, Stop) is True
    done = time.monotonic()
    t.join()
    assert landed and done >= landed[0]


_WRITER = textwrap.dedent("""
    import sys, time
    from runtime import objectstore
    from runtime.formats import donefile
    real = objectstore.filesystem
    def slow(location):
        fs, path = real(location)
        if not getattr(fs, "_slowed", False):
            orig = fs.pipe_file
            def pipe(p, data, **kw):
                time.sleep(0.05)          # the window a kill lands in: between read and write
                return orig(p, data, **kw)
            fs.pipe_file, fs._slowed = pipe, True
        return fs, path
    objectstore.filesystem = slow
    root, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for v in range(first, last + 1):
        donefile.append(root, "base", donefile.base_record(v))
        print(v, flush=True)
""")


def test_donefile_publisher_killed_mid_append_loses_and_duplicates_nothing(s3_server, s3_bucket):
    """A publisher appends versions 1..N; it is SIGKILLed several times at random moments
    and restarted from the first version not known to be done (as the trainer resumes from
    its last exported version, repeating an append it may have completed)."""
    root = f"{s3_bucket}/model"
    env = {**os.environ, **s3_server.env()}
    n, start, kills = 30, 1, 0
    rng = __import__("random").Random(7)
    while start <= n:
        p = subprocess.Popen([sys.executable, "-c", _WRITER, root, str(start), str(n)], env=env,
                             stdout=subprocess.PIPE, text=True)
        if kills < 4:
            time.sleep(rng.uniform(1.5, 3.0))
            p.send_signal(signal.SIGKILL)
            kills += 1
        out, _ = p.communicate(timeout=120)
        done = [int(x) for x in out.split()]
        # restart at the last version reported done (its append is repeated: must not duplicate)
        start = done[-1] if done else start
        if p.returncode == 0:
            break
    assert kills >= 1
    ids = [r.id for r in donefile.read(root, "base")]
    assert ids == list(range(1, n + 1))
    text = storage.read_bytes(donefile.location(root, "base")).decode()
    assert text.endswith("\n") and len(text.splitlines()) == n
