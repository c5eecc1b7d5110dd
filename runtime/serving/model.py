"""Dense models of served versions, and the watcher that follows the version cube serves.

A version is the id of a base or patch (``runtime.formats.donefile``): its dense model
lives at ``ROOT/versions/<id>/dense`` (``runtime.formats.model_meta``) and its embeddings
in cube under the same id. Serving answers each request with exactly one ``DenseModel``
and pins the cube lookup to that model's version, so a dense model and embeddings of
different versions are never mixed.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from runtime import dense_backends, storage
from runtime.formats.dict_info import fetch_dict_info
from runtime.formats import donefile, manifest
from runtime.formats.model_meta import FILE as META_FILE
from runtime.formats.model_meta import ModelMeta, ModelMetaError

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A version's dense model could not be fetched or loaded; the message names it."""


class DenseModel:
    """One version's dense model: ``version`` (int), ``meta`` (``ModelMeta``), its
    predictor on ``backend`` (``runtime.dense_backends``: ONNX Runtime on ``model.onnx``,
    or Paddle Inference; ``dense_backend`` asks for one, and ``fallback`` says why a
    version without ``model.onnx`` runs on Paddle Inference instead) with ``pool_size``
    concurrent runs, ``data_end`` (the version's data time, unix s, or None). ``predict``
    is thread-safe. ``combiner`` is set by serving (concurrent requests of this version are
    combined into one run). Raises ``ModelLoadError``."""

    def __init__(self, version: int, model_dir: str | os.PathLike, pool_size: int = 4,
                 dense_backend: str = dense_backends.DEFAULT):
        from runtime.inference import PredictorError

        self.version = int(version)
        self.dir = Path(model_dir)
        try:
            self.meta = ModelMeta.read(self.dir)
            if self.meta.version != self.version:
                raise ModelLoadError(f"{self.dir / META_FILE}: version {self.meta.version}, expected {self.version}")
            loaded = dense_backends.load(self.dir, self.meta, dense_backend, pool_size)
        except (ModelMetaError, PredictorError) as exc:
            raise ModelLoadError(str(exc)) from exc
        self.predictor, self.backend, self.fallback = loaded.predictor, loaded.backend, loaded.fallback
        self.num_slots = self.meta.num_slots
        self.dim = self.meta.embedding_dim
        self.loaded_at = time.time()
        self.combiner = None
        self.data_end: int | None = None  # its donefile line's data_end (unix s), set by the watcher

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``dense`` float32[n,13] normalized; ``emb`` float32[num_slots*n, dim] slot-major.
        Returns the probabilities, float32[n,1]."""
        return self.predictor.predict(dense, emb)


def fetch_model(model_root: str, rel: str, version: int, work_dir: str | os.PathLike) -> Path:
    """Makes ``model_root/rel`` (a version's dense directory) available locally.

    A local directory is used in place. From a URL, ``model_meta.json`` is downloaded first
    and then the files it names (``ModelMeta.files``: the program, its parameters and the
    ONNX model when there is one), into ``work_dir/<version>/`` (a temporary
    directory renamed into place once complete); an object-store location alike.
    Returns the local directory.
    Raises ``ModelLoadError``."""
    loc = storage.join(model_root, rel)
    if not storage.is_remote(loc):
        if not os.path.isdir(loc):
            raise ModelLoadError(f"{loc}: no such directory")
        return Path(loc)
    dest = Path(work_dir) / str(version)
    if (dest / ".complete").exists():
        return dest
    base = loc.rstrip("/") + "/"
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work_dir, prefix=f".{version}."))
    try:
        storage.download(base + META_FILE, tmp / META_FILE)
        meta = ModelMeta.read(tmp)
        for name in meta.files:
            storage.download(base + name, tmp / name)
        (tmp / ".complete").write_text("ok")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return dest
    except (storage.LocationError, ModelMetaError) as exc:
        raise ModelLoadError(f"{base}: {exc}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_dense(model_root: str, rec: donefile.DonefileRecord, local: str | os.PathLike) -> None:
    """Checks the local copy ``local`` of ``rec``'s dense directory against the manifest
    its donefile line names (``runtime.formats.manifest``): every ``dense/`` file present
    with its size and SHA-256. Raises ``ModelLoadError`` naming the file and what differs
    (or the manifest missing, malformed or unreachable)."""
    try:
        man = manifest.read(model_root, rec.manifest, rec.id)
        entries = man.under(manifest.DENSE_DIR)
        if not entries:
            raise manifest.ManifestMismatch(f"{storage.join(model_root, rec.manifest)}: lists no dense file")
        base = storage.join(model_root, rec.model or donefile.dense_dir(rec.id)).rstrip("/")
        for e in entries:
            rel = e.path[len(manifest.DENSE_DIR) + 1:]
            manifest.verify_file(e, Path(local) / rel, f"{base}/{rel}")
    except (manifest.ManifestError, storage.LocationError) as exc:
        raise ModelLoadError(f"version {rec.id} refused: {exc}") from None


class VersionWatcher:
    """Follows the version cube serves and keeps the matching ``DenseModel`` current.

    Source of the target version: the transfer's ``GET /dict/info`` (when
    ``transfer_url`` is set), else the newest id in ``ROOT/donefile/{base,patch}.txt``.
    With ``shard_num`` (the shard count of this process's cube topology) a version counts
    only if ``/dict/info`` says it is laid out for that many shards
    (``DictInfo.version_for``): after a resize, a pod on the new layout waits (not
    ready) until the served chain is laid out there, and a pod left on the old one keeps
    the version it serves until it is replaced. A new version is switched to only after
    its dense model is loaded (and warmed up) and ``probe(version)`` succeeds (serving's
    asks every shard for it: ``CubeClient.probe``); until then the previous model keeps
    answering. Each version gets its own session (ONNX Runtime) or predictors (Paddle
    Inference) on ``dense_backend`` (``runtime.dense_backends``). ``current`` is replaced
    by one atomic assignment, so a request that read it uses one version from start to end.
    """

    def __init__(self, model_root: str, transfer_url: str | None, work_dir: str | os.PathLike,
                 pool_size: int = 4, poll_interval_s: float = 0.5,
                 probe: Callable[[int], None] | None = None, keep_versions: int = 3,
                 shard_num: int | None = None, dense_backend: str = dense_backends.DEFAULT):
        if shard_num is not None and int(shard_num) < 1:
            raise ValueError(f"shard_num must be >= 1, got {shard_num}")
        self.dense_backend = dense_backends.check(dense_backend)
        self.shard_num = None if shard_num is None else int(shard_num)
        self.model_root = model_root
        self.transfer_url = transfer_url.rstrip("/") if transfer_url else None
        self.work_dir = Path(work_dir)
        self.pool_size = pool_size
        self.poll_interval_s = poll_interval_s
        self.probe = probe
        self.keep_versions = keep_versions
        self.current: DenseModel | None = None
        self.last_error: str | None = None
        self.switches = 0
        self.on_switch: list[Callable[[DenseModel], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: dict[int, float] = {}  # version -> time of the last failed load

    # -- the target version ------------------------------------------------------------
    def _records(self) -> list[donefile.DonefileRecord]:
        return donefile.read(self.model_root, "base") + donefile.read(self.model_root, "patch")

    def target(self) -> int | None:
        """The version that should be served now (None if none is known yet, or none is
        laid out for ``shard_num`` shards)."""
        if self.transfer_url:
            info = fetch_dict_info(self.transfer_url, timeout_s=2, session=storage.session())
            if self.shard_num is None:
                return info.version
            v = info.version_for(self.shard_num)
            if v is None and info.version is not None and self.current is None:
                self.last_error = (f"version {info.version} is laid out for {info.served_shard_num} shards, "
                                   f"this topology has {self.shard_num}")
            return v
        return max((r.id for r in self._records()), default=None)

    def _record(self, version: int) -> donefile.DonefileRecord | None:
        return next((r for r in self._records() if r.id == version), None)

    # -- loading -----------------------------------------------------------------------
    def load(self, version: int) -> DenseModel:
        """Fetches, checks against the version's manifest (when its donefile line names
        one: ``check_dense``), loads and warms up ``version``'s dense model (not yet
        current). Raises ``ModelLoadError``."""
        t0 = time.monotonic()
        rec = self._record(version)
        rel = rec.model if rec is not None and rec.model else donefile.dense_dir(version)
        local = fetch_model(self.model_root, rel, version, self.work_dir)
        if rec is not None and rec.manifest:
            try:
                check_dense(self.model_root, rec, local)
            except ModelLoadError:
                if Path(local).parent == self.work_dir:  # a downloaded copy: fetched again next time
                    shutil.rmtree(local, ignore_errors=True)
                raise
        model = DenseModel(version, local, self.pool_size, self.dense_backend)
        model.data_end = rec.data_end if rec is not None else None
        model.predict(np.zeros((1, model.meta.features.num_dense), np.float32),
                      np.zeros((model.num_slots, model.dim), np.float32))
        log.info("loaded dense model of version %d from %s on %s in %.0f ms", version, local, model.backend,
                 (time.monotonic() - t0) * 1e3)
        return model

    def poll_once(self) -> bool:
        """One check: switches to a new target version if it can. True on a switch."""
        try:
            v = self.target()
        except Exception as exc:  # transfer down: keep serving what we have
            self.last_error = f"version source unreachable: {exc.__class__.__name__}: {exc}"
            return False
        if v is None or (self.current is not None and v == self.current.version):
            return False
        if v in self._failed and time.monotonic() - self._failed[v] < 5.0:
            return False
        try:
            model = self.load(v)
            if self.probe is not None:
                self.probe(v)
        except Exception as exc:
            self._failed[v] = time.monotonic()
            self.last_error = f"version {v}: {exc.__class__.__name__}: {exc}"
            log.warning("not switching to version %d yet: %s", v, self.last_error)
            return False
        old = self.current
        self.current = model  # the atomic switch
        self.switches += 1
        self.last_error = None
        log.info("serving version %d (was %s)", v, old.version if old else None)
        for cb in self.on_switch:
            try:
                cb(model)
            except Exception:
                log.exception("on_switch callback failed")
        self._cleanup(keep={v} | ({old.version} if old else set()))
        return True

    def _cleanup(self, keep: set[int]) -> None:
        if not self.work_dir.exists():
            return
        dirs = sorted((d for d in self.work_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                      key=lambda d: int(d.name))
        for d in dirs[:-self.keep_versions]:
            if int(d.name) not in keep:
                shutil.rmtree(d, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.poll_interval_s)

    def start(self) -> None:
        """Starts the polling thread (daemon)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="version-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
