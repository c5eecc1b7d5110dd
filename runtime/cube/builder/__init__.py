"""Cube builder: SequenceFiles -> per-shard dicts, tars, md5s and a build record.

``build(inputs, output_dir, dict_name, shard_num, version, mode, base_version)`` writes
(names and ``build.json`` owned by ``runtime/cube/buildinfo.py``; the reference is Paddle
Serving's cube-builder)::

    <output_dir>/<dict_name>/<version>/<dict_name>_part<i>/        shard dict (runtime/cube/dictfile.py)
    <output_dir>/<dict_name>/<version>/<dict_name>_part<i>.tar     that directory as an uncompressed tar
    <output_dir>/<dict_name>/<version>/<dict_name>_part<i>.tar.md5 hex md5 of the tar
    <output_dir>/<dict_name>/<version>/build.json                  the BuildRecord

- Shard of a key: ``runtime.formats.topology.shard_rows`` (``key % shard_num``).
- Duplicate keys (within a file or across files, inputs read in the order given):
  the last one wins; ``duplicates`` counts the records dropped.
- A delta (``mode="delta"``) holds exactly the keys of its inputs (changed and new) and
  names its base (``base_version``); the server applies it in place (docs/cube.md).
- Everything is written under ``<output_dir>/<dict_name>/.tmp-<version>-<pid>/`` and
  renamed to ``<version>/`` at the end, so a failure (e.g. a corrupt SequenceFile,
  reported with its file and byte offset by ``SequenceFileError``) publishes nothing.
  An existing ``<version>/`` is replaced only once the new one is complete.
- Vectorized: the records of a file are parsed by numpy in chunks (seqfile), partition
  and last-wins dedup are numpy (a stable sort), the hash index is built by the C kernel;
  no Python loop runs per key. The md5 is computed while the tar is written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np

from runtime import storage
from runtime.cube import dictfile
from runtime.cube.buildinfo import FILE, BuildRecord, ShardBuild, md5_name, part_name, shard_tar_name
from runtime.cube.kernel import KERNEL
from runtime.formats.seqfile import iter_sequence_file
from runtime.formats.topology import shard_rows

log = logging.getLogger(__name__)


class BuildError(ValueError):
    """The inputs cannot be built (no files, dims differ, bad arguments); names the input."""


def expand_inputs(inputs: list[str]) -> list[str]:
    """Paths, directories (their files, except names starting with ``.`` or ``_`` such as
    ``_SUCCESS``), globs and URLs -> the ordered list of SequenceFiles.
    Raises ``BuildError`` when an input matches nothing."""
    files: list[str] = []
    for loc in inputs:
        got = [f for f in storage.expand(str(loc))
               if storage.is_url(f) or not os.path.basename(f).startswith((".", "_"))]
        if not got:
            raise BuildError(f"input {loc}: no SequenceFile found")
        files.extend(got)
    return files


def read_inputs(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All records of ``files`` in order: ``(keys uint64[n], values float32[n, dim])``.
    Raises ``SequenceFileError`` (file + offset) or ``BuildError`` (dims differ)."""
    keys, values, dim, dim_file = [], [], None, None
    for f in files:
        for k, v in iter_sequence_file(f):
            if k.shape[0] == 0:
                continue
            v = v.reshape(k.shape[0], -1)
            if dim is None:
                dim, dim_file = v.shape[1], f
            elif v.shape[1] != dim:
                raise BuildError(f"{f}: values have dim {v.shape[1]}, but {dim_file} has dim {dim}")
            keys.append(k)
            values.append(v)
    if not keys:
        return np.empty(0, np.uint64), np.empty((0, dim or 0), np.float32)
    return (np.concatenate(keys).astype(np.uint64, copy=False),
            np.concatenate(values).astype(np.float32, copy=False))


def dedup_last_wins(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys[rows]`` -> ``(unique keys, the row of each key's last occurrence)``.

    Keys come out in input order when there are no duplicates (checked by building the
    hash index, which the dict needs anyway), else ascending (numpy sort)."""
    k = keys[rows]
    try:
        KERNEL.build_index(k, dictfile.capacity_for(k.shape[0]))
        return k, rows
    except ValueError:
        pass
    rev = k[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    last = rows[::-1][first_in_rev]
    return uniq, last


class _HashingWriter:
    """A write-only file wrapper that md5s what passes through (for tarfile)."""

    def __init__(self, f):
        self.f, self.md5, self.n = f, hashlib.md5(), 0

    def write(self, b) -> int:
        self.md5.update(b)
        self.n += len(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.n


def write_tar(src_dir: Path, tar_path: Path) -> tuple[str, int]:
    """Tars ``src_dir`` (as its own name, files sorted, no compression) into ``tar_path``;
    returns ``(hex md5, tar bytes)``."""
    with open(tar_path, "wb") as raw:
        w = _HashingWriter(raw)
        with tarfile.open(fileobj=w, mode="w", format=tarfile.GNU_FORMAT) as tar:
            tar.add(src_dir, arcname=src_dir.name, recursive=False)
            for p in sorted(src_dir.iterdir()):
                ti = tar.gettarinfo(str(p), arcname=f"{src_dir.name}/{p.name}")
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                with open(p, "rb") as f:
                    tar.addfile(ti, f)
        return w.md5.hexdigest(), w.n


def build(inputs: list[str], output_dir: str | os.PathLike, dict_name: str, shard_num: int,
          version: int, mode: str = "base", base_version: int | None = None) -> BuildRecord:
    """Builds one version (see the module docstring). Returns its ``BuildRecord``
    (``runtime/cube/buildinfo.py``), as written to ``build.json``.

    Raises ``BuildError`` (bad arguments, no inputs, dims differ), ``SequenceFileError``
    (corrupt input, with file and byte offset), ``OSError``; nothing is published then."""
    t0 = time.perf_counter()
    if shard_num < 1:
        raise BuildError(f"shard_num must be >= 1, got {shard_num}")
    if mode not in dictfile.MODES:
        raise BuildError(f"mode must be one of {dictfile.MODES}, got {mode!r}")
    if mode == "delta" and base_version is None:
        raise BuildError("a delta build needs base_version (the version it applies to)")
    if mode == "base":
        base_version = None
    version = int(version)
    files = expand_inputs(list(inputs))
    keys, values = read_inputs(files)
    if keys.shape[0] == 0 and mode == "base":
        raise BuildError(f"inputs {inputs}: no records")
    dim = int(values.shape[1])
    dict_root = Path(output_dir) / dict_name
    dict_root.mkdir(parents=True, exist_ok=True)
    tmp = dict_root / f".tmp-{version}-{os.getpid()}"
    final = dict_root / str(version)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shards: list[ShardBuild] = []
    duplicates = 0
    try:
        for shard, rows in enumerate(shard_rows(keys, shard_num)):
            k, last = dedup_last_wins(keys, rows)
            d = dictfile.make_shard_dict(k, values[last], dict_name=dict_name, shard=shard,
                                         shard_num=shard_num, version=version, mode=mode,
                                         base_version=base_version)
            name, tar = part_name(dict_name, shard), shard_tar_name(dict_name, shard)
            meta = dictfile.write_shard_dict(tmp / name, d)
            md5, tar_bytes = write_tar(tmp / name, tmp / tar)
            (tmp / md5_name(tar)).write_text(md5 + "\n")
            shards.append(ShardBuild(shard=shard, dir=name, tar=tar, md5=md5, count=meta.count,
                                     bytes=meta.bytes, tar_bytes=tar_bytes))
            duplicates += int(rows.shape[0] - k.shape[0])
        result = BuildRecord(dict_name=dict_name, version=version, mode=mode, base_version=base_version,
                             shard_num=int(shard_num), dim=dim, count=sum(s.count for s in shards),
                             duplicates=duplicates, input_records=int(keys.shape[0]), inputs=files,
                             shards=shards, output_dir=str(final),
                             seconds=round(time.perf_counter() - t0, 4))
        result.write(tmp / FILE)
        if final.exists():  # a rebuild of the same version: swap, then drop the old one
            old = dict_root / f".old-{version}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("built %s version %d (%s%s): %d keys (%d duplicates dropped), dim %d, %d shards in %.2f s",
             dict_name, version, mode, f" on {base_version}" if base_version else "", result.count,
             result.duplicates, dim, shard_num, result.seconds)
    return result


def main(args) -> int:
    """``elastic-ctr cube build``: prints the BuildRecord as JSON; exit 1 on bad input."""
    from runtime.formats.seqfile import SequenceFileError

    try:
        res = build(args.input, args.output, args.dict, args.shards, args.version,
                    mode=args.mode, base_version=args.base_version)
    except (BuildError, SequenceFileError, dictfile.DictFormatError, storage.LocationError) as exc:
        log.error("build failed, nothing published: %s", exc)
        return 1
    print(json.dumps(res.model_dump()))
    return 0
