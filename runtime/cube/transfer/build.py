"""The transfer's Building and Deploying phases: list and fetch a version's SequenceFiles,
run the builder, publish the shard tars where the agents download them.

Builds go to ``<work_dir>/build/<dict>/<version>/`` (a re-layout's to
``<work_dir>/build/relayout-<N>shards/<dict>/<version>/``, never over the original's);
the tars are published under ``ROOT/cube/<dict>/<version>/`` (a re-layout's under
``ROOT/cube/<dict>/<version>-<N>shards/``), with their ``.md5`` and ``build.json`` last.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import requests

from runtime import storage, storage_write
from runtime.cube.buildinfo import FILE as BUILD_FILE
from runtime.cube.buildinfo import BuildRecord, BuildRecordError, md5_name
from runtime.cube.transfer.agents import RolloutError, Shipment
from runtime.cube.transfer.planner import relayout_name
from runtime.cube.transfer.state import Phase, Plan
from runtime.cube.transfer import verify
from runtime.formats.donefile import DonefileRecord

log = logging.getLogger(__name__)

#: ``(inputs, output_dir, dict_name, shard_num, version, mode, base_version)``, writing the
#: builder's layout (``runtime.cube.builder.build``)
BuildFn = Callable[[list, str, str, int, int, str, object], object]


def default_build(inputs, output_dir, dict_name, shard_num, version, mode, base_version):
    """``runtime.cube.builder.build``."""
    from runtime.cube import builder

    return builder.build(inputs, output_dir, dict_name, shard_num, version, mode=mode, base_version=base_version)


def list_inputs(location: str, timeout_s: float = 30.0) -> list[str]:
    """The SequenceFile parts at ``location``: a local file, directory or glob, or a file
    server directory URL listed through its JSON listing (``GET <dir>/?format=json`` ->
    ``{"entries": [{"name", "type", "size"}]}``), or an object-store prefix
    (``s3://...``, listed through fsspec). Names starting with ``.`` or ``_``
    (``_SUCCESS``, temporaries) and ``.crc``/``.md5`` files are skipped. Raises
    ``storage.LocationError`` naming the location if nothing is found."""
    def keep(name: str) -> bool:
        return not name.startswith((".", "_")) and not name.endswith((".crc", ".md5"))

    if storage.is_url(location):
        url = location.rstrip("/") + "/?format=json"
        try:
            r = storage.session().get(url, timeout=timeout_s, headers={"Accept": "application/json"})
        except requests.RequestException as exc:
            raise storage.LocationError(f"{location}: listing unreachable ({exc})") from exc
        if r.status_code == 404:
            raise storage.LocationError(f"{location}: no such directory (HTTP 404)")
        if r.status_code >= 400:
            raise storage.LocationError(f"{location}: listing failed: HTTP {r.status_code}")
        try:
            entries = r.json()["entries"]
        except (ValueError, KeyError, TypeError) as exc:
            raise storage.LocationError(f"{location}: not a JSON directory listing ({exc})") from exc
        files = sorted(storage.join(location.rstrip("/") + "/", e["name"]) for e in entries
                       if e.get("type") == "file" and keep(str(e["name"])))
    else:
        files = [f for f in storage.expand(location) if keep(os.path.basename(f))]
    if not files:
        raise storage.LocationError(f"{location}: no SequenceFile part files")
    return files


@dataclass
class Build:
    """A finished build: its directory, ``dim``, ``count`` (keys), and per shard (in shard
    order) the tar's local path and md5."""

    dir: Path
    dim: int | None
    count: int | None
    tars: list[Path]
    md5s: list[str]


class Builder:
    """Building and Deploying for one transfer: ``root`` (version root), ``work_dir``,
    ``dict_name``, ``shard_num`` (the topology's), ``publish_url`` (where agents download
    ``cube/...``), ``token`` (upload token), ``build_fn`` (the builder). ``records``: the
    donefiles' lines by version id (the transfer's, filled as it reads them): a version
    whose line names a manifest is verified against it before it is built (``verify``)."""

    def __init__(self, root: str, work_dir: Path, dict_name: str, shard_num: int, publish_url: str,
                 token: str | None, build_fn: BuildFn = default_build):
        self.root, self.work_dir, self.dict_name = root, work_dir, dict_name
        self.shard_num, self.publish_url, self.token = shard_num, publish_url, token
        self.build_fn = build_fn
        self.records: dict[int, DonefileRecord] = {}

    def build_root(self, plan: Plan) -> Path:
        """The builder's ``output_dir`` for ``plan``."""
        if plan.relayout:
            return self.work_dir / "build" / f"relayout-{plan.relayout.to}shards"
        return self.work_dir / "build"

    def version_dir(self, plan: Plan) -> Path:
        return self.build_root(plan) / self.dict_name / str(plan.version)

    def build(self, plan: Plan) -> Build:
        """Builds ``plan``'s version (a finished build of an interrupted rollout is reused),
        after checking its files against its manifest. Raises ``RolloutError(Building)``
        naming the input, ``verify.VersionRefused`` for a version that is not whole."""
        v = plan.version
        vdir = self.version_dir(plan)
        meta = vdir / BUILD_FILE
        if meta.exists():
            try:
                done = self._read(vdir)
                log.info("Building version=%d: reusing the finished build in %s", v, vdir)
                return done
            except (OSError, BuildRecordError, RolloutError):
                shutil.rmtree(vdir, ignore_errors=True)
        rec = self.records.get(v)
        man = verify.load_manifest(self.root, rec)
        location = storage.join(self.root, plan.input)
        # held patches' rows (model gate: Plan.carry) and the patches a coalesced rollout folds
        # (Plan.coalesced_inputs) first, oldest first: the builder keeps a key's last row
        try:
            own = list_inputs(location)
            inputs = [f for c in [*plan.carry, *plan.coalesced_inputs]
                      for f in list_inputs(storage.join(self.root, c))] + own
        except storage.LocationError as exc:
            raise RolloutError(Phase.BUILDING, f"input of version {v}: {exc}") from exc
        fetched = None
        listed = inputs
        if any(storage.is_remote(i) for i in inputs):
            fetched = self.work_dir / "inputs" / str(v)
            inputs = self._fetch(inputs, fetched, v)
        if man is not None:  # this version's own files against its manifest
            t = time.monotonic()
            try:
                verify.check_sparse(man, location, listed[-len(own):], inputs[-len(own):], rec.count)
                verify.check_dense(man, self.root, rec, self.work_dir / "verify")
            except Exception:
                if fetched is not None:
                    shutil.rmtree(fetched, ignore_errors=True)
                raise
            log.info("Building version=%d: %d files match its manifest (%.2f s)", v, len(man.files),
                     time.monotonic() - t)
        log.info("Building version=%d mode=%s from %d part files at %s%s", v, plan.mode, len(inputs), location,
                 f" and the coalesced patches {plan.coalesced}" if plan.coalesced else "")
        try:
            self.build_fn(inputs, str(self.build_root(plan)), self.dict_name, self.shard_num, v, plan.mode,
                          plan.base_version)
        except Exception as exc:  # noqa: BLE001 - a bad input must not kill the transfer
            shutil.rmtree(vdir, ignore_errors=True)
            raise RolloutError(Phase.BUILDING, f"version {v} from {location}: {type(exc).__name__}: {exc}") from exc
        finally:
            if fetched is not None:
                shutil.rmtree(fetched, ignore_errors=True)
        try:
            return self._read(vdir)
        except (OSError, BuildRecordError) as exc:
            raise RolloutError(Phase.BUILDING, f"version {v}: builder wrote no readable {meta}: {exc}") from exc

    def _fetch(self, urls: list[str], dest: Path, v: int) -> list[str]:
        """Downloads the part files (in parallel: I/O bound) into ``dest``."""
        shutil.rmtree(dest, ignore_errors=True)
        # numbered: a coalesced rollout's patches each have a part-00000; the order is kept
        local = [str(dest / f"{i:05d}-{u.rstrip('/').rsplit('/', 1)[-1]}") for i, u in enumerate(urls)]
        t = time.monotonic()
        try:
            with cf.ThreadPoolExecutor(max_workers=min(4, len(urls))) as ex:
                list(ex.map(storage.download, urls, local))
        except storage.LocationError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            raise RolloutError(Phase.BUILDING, f"input of version {v}: {exc}") from exc
        log.info("Building version=%d: downloaded %d part files (%d bytes) in %.2f s", v, len(local),
                 sum(os.path.getsize(p) for p in local), time.monotonic() - t)
        return local

    def _read(self, vdir: Path) -> Build:
        """The builder's ``build.json`` in ``vdir`` (``runtime/cube/buildinfo.py``), checked
        against the topology. Raises ``BuildRecordError`` (unreadable or invalid record),
        ``RolloutError(Building)`` (shard count differs) or ``OSError`` (a tar missing)."""
        rec = BuildRecord.read(vdir)
        if rec.shard_num != self.shard_num:
            raise RolloutError(Phase.BUILDING, f"{vdir / BUILD_FILE}: {rec.shard_num} shards do not "
                                               f"match the topology's {self.shard_num}")
        tars = [vdir / s.tar for s in rec.shards]
        for tar in tars:
            if not tar.exists():
                raise FileNotFoundError(f"{tar}: missing")
        return Build(dir=vdir, dim=rec.dim, count=rec.count, tars=tars, md5s=[s.md5 for s in rec.shards])

    def publish(self, build: Build, plan: Plan, name: str | None = None) -> Shipment:
        """Publishes each shard tar (and its ``.md5``), then ``build.json``, under
        ``ROOT/cube/<dict>/<name>/`` (``name``: default the version id, or a re-layout's
        name); returns the agents' download URLs. Raises ``RolloutError(Deploying)``."""
        v = plan.version
        name = name or (relayout_name(v, plan.relayout.to) if plan.relayout else str(v))
        rel = f"cube/{self.dict_name}/{name}"
        files = [f for tar in build.tars for f in (tar, tar.with_name(md5_name(tar.name))) if f.exists()]
        urls = [storage.join(self.publish_url, f"{rel}/{tar.name}") for tar in build.tars]

        def put(f: Path) -> None:
            storage_write.upload(f, storage.join(self.root, f"{rel}/{f.name}"), self.token)

        try:  # in parallel (I/O bound); build.json last, once the tars are in place
            with cf.ThreadPoolExecutor(max_workers=min(4, len(files))) as ex:
                list(ex.map(put, files))
            if (build.dir / BUILD_FILE).exists():
                put(build.dir / BUILD_FILE)
        except (storage.LocationError, OSError) as exc:
            raise RolloutError(Phase.DEPLOYING, f"publishing version {v} under "
                                                f"{storage.join(self.root, rel)}: {exc}") from exc
        return Shipment(urls=urls, md5s=list(build.md5s))

    def discard(self, plan: Plan) -> None:
        """Removes ``plan``'s build (a retry rebuilds from the inputs)."""
        shutil.rmtree(self.version_dir(plan), ignore_errors=True)

    def cleanup(self, keep_relayout: bool) -> None:
        """Keeps the last two builds under ``<work_dir>/build/<dict>``; removes the
        re-layout builds unless one is pending."""
        d = self.work_dir / "build" / self.dict_name
        if d.is_dir():
            versions = sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())
            for old in versions[:-2]:
                shutil.rmtree(d / str(old), ignore_errors=True)
        if not keep_relayout:
            for p in (self.work_dir / "build").glob("relayout-*shards"):
                shutil.rmtree(p, ignore_errors=True)
