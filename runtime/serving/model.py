"""Dense models of served versions, and the watcher that follows the version cube serves.

A *version* is the id of a base or patch (docs/contracts.md): its dense model lives at
``ROOT/versions/<id>/dense`` (``inference.json`` or ``inference.pdmodel``,
``inference.pdiparams``, ``model_meta.json``) and its embeddings in cube under the same
id. Serving answers each request with exactly one ``DenseModel`` and pins the cube
lookup to that model's version, so a dense model and embeddings of different versions
are never mixed.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from runtime import storage

log = logging.getLogger(__name__)

MODEL_FILES = ("model_meta.json", "inference.pdiparams", "inference.json", "inference.pdmodel")


class ModelLoadError(RuntimeError):
    """A version's dense model could not be fetched or loaded; the message names it."""


def _emb_index(name: str) -> int:
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else 1 << 30


class DenseModel:
    """One version's dense inference program, as a pool of Paddle predictors.

    ``version`` (int), ``meta`` (model_meta.json), ``dense_feed`` / ``emb_feeds`` (feed
    names: the dense features float32[n,13] and one float32[n,dim] per slot, in slot
    order), ``dim`` (embedding width), ``num_slots``. ``predict`` is thread-safe: each
    call borrows one predictor (1 math thread each) from a pool of ``pool_size``.
    """

    def __init__(self, version: int, model_dir: str | os.PathLike, pool_size: int = 4):
        from paddle import inference

        self.version = int(version)
        self.dir = Path(model_dir)
        meta_path = self.dir / "model_meta.json"
        try:
            self.meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        except ValueError as exc:
            raise ModelLoadError(f"{meta_path}: not JSON ({exc})") from exc
        prog = None
        for name in ("inference.json", "inference.pdmodel"):
            if (self.dir / name).exists():
                prog = self.dir / name
                break
        params = self.dir / "inference.pdiparams"
        if prog is None or not params.exists():
            raise ModelLoadError(f"{self.dir}: no inference.json/.pdmodel + inference.pdiparams")
        config = inference.Config(str(prog), str(params))
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(1)
        config.disable_glog_info()
        if prog.suffix == ".json":  # PIR program: needs the new IR and executor
            config.enable_new_ir(True)
            config.enable_new_executor(True)
        else:  # legacy ProgramDesc: the old executor is the fastest for this small DNN
            # (measured, batch 1, 1 thread, copies included: 225 us vs 300 us with the new
            # executor and 400 us through the new IR)
            config.enable_new_ir(False)
            config.enable_new_executor(False)
        config.switch_ir_optim(True)
        try:
            first = inference.create_predictor(config)
        except Exception as exc:  # Paddle raises its own error types
            raise ModelLoadError(f"{prog}: cannot load ({exc.__class__.__name__}: {exc})") from exc
        names = list(first.get_input_names())
        feeds = self.meta.get("feeds")
        dense_name = None
        emb_order = None
        if isinstance(feeds, list) and feeds and all(isinstance(f, str) for f in feeds):
            dense_name, emb_order = feeds[0], feeds[1:]  # the export's order: dense, then slots
        elif isinstance(feeds, dict):
            dense_name = feeds.get("dense") or feeds.get("dense_input")
            if isinstance(dense_name, dict):
                dense_name = dense_name.get("name")
        if dense_name not in names:
            dense_name = next((n for n in names if "dense" in n), None)
        if dense_name is None:
            raise ModelLoadError(f"{prog}: no dense feed among {names}")
        self.dense_feed = dense_name
        if emb_order and sorted(emb_order) == sorted(n for n in names if n != dense_name):
            self.emb_feeds = list(emb_order)
        else:
            self.emb_feeds = sorted((n for n in names if n != dense_name), key=_emb_index)
        self.num_slots = len(self.emb_feeds)
        self.output_name = list(first.get_output_names())[0]
        dim = self.meta.get("embedding_dim", self.meta.get("dim", self.meta.get("emb_dim")))
        self.dim = int(dim) if dim is not None else None
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        preds = [first] + [first.clone() for _ in range(max(0, pool_size - 1))]
        for p in preds:
            handles = [p.get_input_handle(dense_name)] + [p.get_input_handle(n) for n in self.emb_feeds]
            self._pool.put((p, handles, p.get_output_handle(self.output_name)))
        self.loaded_at = time.time()
        self.combiner = None  # set by serving: combines concurrent requests (server.Combiner)

    def predict(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``dense`` float32[n,13] normalized; ``emb`` float32[num_slots*n, dim] in
        slot-major order (rows ``s*n .. s*n+n-1`` are slot ``s``'s embeddings).
        Returns probabilities float32[n,1]."""
        n = dense.shape[0]
        p, handles, out = self._pool.get()
        try:
            handles[0].copy_from_cpu(dense)
            for s, h in enumerate(handles[1:]):
                h.copy_from_cpu(emb[s * n:(s + 1) * n])
            p.run()
            return out.copy_to_cpu()
        finally:
            self._pool.put((p, handles, out))


def fetch_model(model_root: str, rel: str, version: int, work_dir: str | os.PathLike) -> Path:
    """Makes ``model_root/rel`` (a version's dense directory) available locally.

    A local directory is used in place. From a URL the files are listed through the
    file server's JSON listing (``?format=json``), falling back to the known names
    (``MODEL_FILES``), and downloaded into ``work_dir/<version>/`` (temporary directory
    renamed into place). Returns the local directory. Raises ``ModelLoadError``.
    """
    loc = storage.join(model_root, rel)
    if not storage.is_url(loc):
        if not os.path.isdir(loc):
            raise ModelLoadError(f"{loc}: no such directory")
        return Path(loc)
    dest = Path(work_dir) / str(version)
    if (dest / ".complete").exists():
        return dest
    base = loc.rstrip("/") + "/"
    names: list[str] = []
    try:
        r = storage.session().get(base, params={"format": "json"}, timeout=10)
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith("application/json"):
            names = [e["name"] for e in r.json().get("entries", []) if e.get("type") == "file"]
    except Exception as exc:  # listing is an optimization: fall back to known names
        log.debug("listing %s failed: %s", base, exc)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work_dir, prefix=f".{version}."))
    try:
        got = []
        for name in names or MODEL_FILES:
            try:
                storage.download(base + name, tmp / name)
                got.append(name)
            except storage.LocationError:
                if names:
                    raise
        if "inference.pdiparams" not in got:
            raise ModelLoadError(f"{base}: no inference.pdiparams")
        (tmp / ".complete").write_text("ok")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return dest
    except storage.LocationError as exc:
        raise ModelLoadError(f"{base}: {exc}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class VersionWatcher:
    """Follows the version cube serves and keeps the matching ``DenseModel`` current.

    Source of the target version: the transfer's ``GET /dict/info`` ``version`` (when
    ``transfer_url`` is set), else the newest id in ``ROOT/donefile/{base,patch}.txt``.
    A new version is switched to only after its dense model is loaded (and warmed up)
    and ``probe(version)`` (a pinned cube lookup) succeeds; until then the previous
    model keeps answering. ``current`` is replaced by one atomic assignment, so a
    request that read it uses one version from start to end.
    """

    def __init__(self, model_root: str, transfer_url: str | None, work_dir: str | os.PathLike,
                 pool_size: int = 4, poll_interval_s: float = 0.5,
                 probe: Callable[[int], None] | None = None, keep_versions: int = 3):
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
    def _donefile_records(self) -> list[dict]:
        recs = []
        for name in ("base.txt", "patch.txt"):
            recs += storage.read_donefile(storage.join(self.model_root, "donefile", name))
        return recs

    def target(self) -> int | None:
        """The version that should be served now (None if none is known yet)."""
        if self.transfer_url:
            r = storage.session().get(self.transfer_url + "/dict/info", timeout=2)
            r.raise_for_status()
            v = r.json().get("version")
            return int(v) if v not in (None, "", 0, -1) else None
        recs = self._donefile_records()
        return max((r["id"] for r in recs), default=None)

    def _model_rel(self, version: int) -> str:
        for rec in self._donefile_records():
            if rec["id"] == version and rec.get("model"):
                return str(rec["model"])
        return f"versions/{version}/dense"

    # -- loading -----------------------------------------------------------------------
    def load(self, version: int) -> DenseModel:
        """Fetches, loads and warms up ``version``'s dense model (not yet current)."""
        t0 = time.monotonic()
        local = fetch_model(self.model_root, self._model_rel(version), version, self.work_dir)
        model = DenseModel(version, local, self.pool_size)
        dim = model.dim or 1
        model.predict(np.zeros((1, 13), np.float32), np.zeros((model.num_slots, dim), np.float32))
        log.info("loaded dense model of version %d from %s in %.0f ms", version, local,
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
