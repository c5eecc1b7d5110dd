"""MLflow tracking of the pipeline's jobs: the one owner of what goes to a tracking server.

A ``Tracker`` never blocks the caller: ``log_params`` / ``log_metrics`` / ``set_tags`` /
``log_dict`` put an event on a bounded queue (``QUEUE_SIZE``) and return; a daemon thread
sends the events in order through ``mlflow.MlflowClient`` (imported lazily, only when a
tracking URI is set: ``mlflow-skinny`` is enough). Each HTTP request is bounded by
``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default here ``REQUEST_TIMEOUT_S``) with
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` retries (default here 0: the thread retries itself).
When the server is down or slow the thread warns once, keeps the failed event and retries
it after a backoff (``BACKOFF_S`` doubling up to ``MAX_BACKOFF_S``), so the run catches up
when the server returns; events that arrive while the queue is full are dropped and
counted (``dropped``). ``close(timeout_s)`` waits at most ``timeout_s`` for the queue to
drain; what is left is counted as dropped and reported in one warning. Training is
therefore slowed by at most ``close``'s timeout, once, at the end of the job.

What the pipeline logs (names are the contract with readers: tests, ``runtime.local.plot``):

* One run per training job (``start_training``): params = the training settings
  (``TrainConfig``) and the job's scale (``trainers``, ``pservers``); tags
  ``elastic_ctr.role`` = ``trainer``, ``elastic_ctr.trainer_id``, ``elastic_ctr.mode``.
  Trainer 0 logs what is global to the job's run; every other trainer logs its own
  figures to a run of its own in the same experiment (tag ``elastic_ctr.trainer_id``,
  ``elastic_ctr.job`` = trainer 0's run name), metrics named as trainer 0's.
* A continuous job: step = the partition's index from ``--start-hour`` (hours).
  Per partition (``PARTITION_METRICS``): ``auc_before`` (trainer 0: the next-hour AUC of
  the model before training on it), ``train_auc``, ``loss``, ``rows``, ``seconds``,
  ``examples_per_s``. Per export (``EXPORT_METRICS``, same step): ``export_rows``,
  ``export_seconds``, ``version_id``; tags ``version.<id>.kind`` / ``version.<id>.base``
  / ``version.<id>.hour`` and artifact ``versions/<id>.json`` (``{"id", "kind", "base",
  "hour", "rows", "seconds", "model_meta": <model_meta.json>}``; never the model itself).
  The run id is kept in ``--state-dir/tracking/trainer-<id>.json`` so a resumed job
  continues its run (``RunIdFile``).
* A batch job: step = the pass (0-based): ``train_auc``, ``loss``, ``test_auc`` (trainer
  0), ``examples_per_s``; at the end ``examples_per_s`` etc. without step and the
  version's tags and artifact.
* The cube transfer (``start_transfer``): one run per transfer (``elastic_ctr.role`` =
  ``transfer``, name ``transfer-<dict>``, continued after a restart through its work
  dir), per rolled-out version (step = the version id): ``rollout_seconds`` and
  ``<phase>_seconds`` for each phase (``building``, ``deploying``, ``downloading``,
  ``reloading``, ``enabling``); tag ``version.<id>.kind``.

Environment: ``MLFLOW_TRACKING_URI`` (no URI: ``start_*`` return ``NullTracker``, nothing
imported), ``MLFLOW_EXPERIMENT_NAME`` (default ``DEFAULT_EXPERIMENT``).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "elastic-ctr"
QUEUE_SIZE = 10_000
REQUEST_TIMEOUT_S = 5.0
BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
CLOSE_TIMEOUT_S = 10.0
RUN_DIR = "tracking"

#: per-partition metrics of a continuous job (``PartitionResult`` fields + derived)
PARTITION_METRICS = ("auc_before", "train_auc", "loss", "rows", "seconds", "examples_per_s")
#: per-export metrics of a continuous job
EXPORT_METRICS = ("export_rows", "export_seconds", "version_id")


def tracking_uri(explicit: Optional[str] = None) -> Optional[str]:
    """The tracking URI: ``explicit`` if given (non-empty), else ``$MLFLOW_TRACKING_URI``,
    else None (tracking off)."""
    uri = explicit or os.environ.get(URI_ENV) or None
    return uri.strip() if uri else None


def experiment_name() -> str:
    """``$MLFLOW_EXPERIMENT_NAME`` or ``DEFAULT_EXPERIMENT``."""
    return os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT


@dataclass
class _Event:
    kind: str  # params | metrics | tags | dict
    payload: Any
    step: Optional[int] = None
    ts_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class NullTracker:
    """Tracking off: every call is a no-op (``run_id`` None, ``dropped`` 0)."""

    run_id: Optional[str] = None
    dropped = 0
    sent = 0

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: Optional[int] = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        pass

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S, status: str = "FINISHED") -> int:
        return 0


class RunIdFile:
    """``<state_dir>/tracking/<name>.json``: ``{"run_id": str, "experiment_id": str,
    "uri": str}`` of a job's run, written atomically once the run exists, read at start so
    a resumed job continues its run. A file for another URI is ignored (a new run)."""

    def __init__(self, state_dir: str, name: str):
        # absolute now: the tracker's thread writes it while a training pass runs in a
        # scratch working directory (runtime.trainer.worker), which a relative path would follow
        self.path = os.path.abspath(os.path.join(state_dir, RUN_DIR, f"{name}.json"))

    def record(self) -> Optional[dict]:
        """The file's ``{"run_id", "experiment_id", "uri"}``, or None when there is none."""
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def read(self, uri: str) -> Optional[str]:
        """The stored run id for ``uri``, or None (no file, another URI, or unreadable: warned)."""
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("tracking: %s is not a run id file (%s); starting a new run", self.path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("uri") != uri or not isinstance(doc.get("run_id"), str):
            return None
        return doc["run_id"]

    def write(self, uri: str, run_id: str, experiment_id: str) -> None:
        """Writes the file atomically (temp file + rename)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"run_id": run_id, "experiment_id": experiment_id, "uri": uri}, f)
        os.replace(tmp, self.path)


class Tracker:
    """A non-blocking MLflow run (module docstring).

    Args:
        uri: the tracking URI (``http://host:port``, ``file:...``, ``sqlite:...``).
        run_name: the run's name (a new run only).
        experiment: the experiment's name (created if missing).
        tags: tags set when the run is created or resumed.
        run_id_file: where the run id is kept (resume), or None.
        queue_size: events held before new ones are dropped.

    The run is created (or resumed) by the thread, so the constructor never waits on the
    server. ``run_id`` is None until then (and stays None while the server is down).
    ``reachable``: None before the first request, then whether the last one got an answer
    (``runtime.metrics.tracking`` exposes it with ``sent``, ``dropped`` and ``failures``).
    """

    def __init__(self, uri: str, run_name: str, experiment: Optional[str] = None,
                 tags: Optional[Mapping[str, Any]] = None, run_id_file: Optional[RunIdFile] = None,
                 queue_size: int = QUEUE_SIZE):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(REQUEST_TIMEOUT_S)))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        self.uri = uri
        self.run_name = run_name
        self.experiment = experiment or experiment_name()
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self.run_id_file = run_id_file
        self.run_id: Optional[str] = None
        self.dropped = 0
        self.sent = 0
        self.failures = 0
        self.reachable: Optional[bool] = None
        _LIVE.add(self)
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._closing = threading.Event()
        self._warned = False
        self._client = None  # set once the run exists
        self._mlflow_client = None
        self._thread = threading.Thread(target=self._loop, name=f"tracking-{run_name}", daemon=True)
        self._thread.start()

    # -- the caller's side: never blocks ------------------------------------------------
    def _put(self, ev: _Event) -> None:
        if self._closing.is_set():
            self.dropped += 1
            return
        try:
            self._q.put_nowait(ev)
        except queue.Full:
            self.dropped += ev.kind != "end"

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params (str() of each value, truncated by MLflow's rules to 6000 characters)."""
        self._put(_Event("params", {k: str(v)[:6000] for k, v in params.items()}))

    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: Optional[int] = None) -> None:
        """Metrics at ``step`` (None values are left out)."""
        vals = {k: float(v) for k, v in metrics.items() if v is not None}
        if vals:
            self._put(_Event("metrics", vals, step))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Tags (values as str)."""
        self._put(_Event("tags", {k: str(v) for k, v in tags.items()}))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """A small JSON artifact at ``artifact_file`` (a relative path ending in .json)."""
        self._put(_Event("dict", (obj, artifact_file)))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S, status: str = "FINISHED") -> int:
        """Waits at most ``timeout_s`` for the queued events, ends the run with ``status``
        (when it can), stops the thread. Returns the events dropped (queue full, or still
        queued at the timeout); warns when any were."""
        self._put(_Event("end", status))
        self._closing.set()
        self._thread.join(timeout_s)
        self.dropped += sum(1 for ev in list(self._q.queue) if ev.kind != "end")
        if self.dropped or self._thread.is_alive():
            log.warning("tracking %s: %d event(s) dropped (server %s %s; %d sent)", self.run_name,
                        self.dropped, self.uri, "unreachable" if self.failures else "slow", self.sent)
        return self.dropped

    # -- the thread ---------------------------------------------------------------------
    def _connect(self):
        import mlflow  # lazily: only when a URI is set

        if self._mlflow_client is None:  # once: later tries only redo the requests
            self._mlflow_client = mlflow.MlflowClient(tracking_uri=self.uri)
        client = self._mlflow_client
        run_id = self.run_id_file.read(self.uri) if self.run_id_file else None
        if run_id is not None:
            try:
                run = client.get_run(run_id)
                if run.info.lifecycle_stage != "active":
                    run_id = None
                else:
                    client.update_run(run_id, status="RUNNING")
                    log.info("tracking: continuing run %s (%s)", run_id, self.run_name)
            except Exception as exc:  # noqa: BLE001 - a deleted or unknown run: a new one
                if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                    raise
                run_id = None
        if run_id is None:
            exp = client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
            run = client.create_run(exp_id, tags=self.tags, run_name=self.run_name)
            run_id = run.info.run_id
            log.info("tracking: run %s (%s) at %s, experiment %s", run_id, self.run_name, self.uri, self.experiment)
        else:
            exp_id = client.get_run(run_id).info.experiment_id
            if self.tags:
                client.log_batch(run_id, tags=_tags(self.tags))
        if self.run_id_file is not None:
            self.run_id_file.write(self.uri, run_id, exp_id)
        self._client, self.run_id = client, run_id

    def _send(self, ev: _Event) -> None:
        from mlflow.entities import Metric, Param

        c, rid = self._client, self.run_id
        if ev.kind == "params":
            c.log_batch(rid, params=[Param(k, v) for k, v in ev.payload.items()])
        elif ev.kind == "metrics":
            c.log_batch(rid, metrics=[Metric(k, v, ev.ts_ms, ev.step or 0) for k, v in ev.payload.items()])
        elif ev.kind == "tags":
            c.log_batch(rid, tags=_tags(ev.payload))
        elif ev.kind == "dict":
            c.log_dict(rid, ev.payload[0], ev.payload[1])
        elif ev.kind == "end":
            c.set_terminated(rid, status=ev.payload)

    def _loop(self) -> None:
        backoff, pending = BACKOFF_S, None
        while True:
            if pending is None:
                try:
                    pending = self._q.get(timeout=0.2)
                except queue.Empty:
                    if self._closing.is_set():
                        return
                    continue
            try:
                if self._client is None:
                    self._connect()
                self._send(pending)
            except Exception as exc:  # noqa: BLE001 - any failure of the server: warn, retry later
                self.failures += 1
                self.reachable = _refused(exc)
                if _refused(exc):  # the server answered: this event can never be taken
                    log.warning("tracking %s: the server refused a %s event (%s); dropped", self.run_name,
                                pending.kind, (str(exc).splitlines() or [""])[0][:200])
                    self._q.task_done()
                    self.dropped += 1
                    pending = None
                    continue
                if not self._warned:
                    self._warned = True
                    log.warning("tracking %s: the server at %s failed (%s: %s); training goes on, "
                                "events are kept and retried (dropped when %d are waiting)", self.run_name,
                                self.uri, type(exc).__name__, (str(exc).splitlines() or [""])[0][:200],
                                self._q.maxsize)
                if self._closing.is_set():  # closing and the server still fails: stop trying
                    self._q.task_done()
                    self.dropped += pending.kind != "end"
                    return
                self._closing.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self._q.task_done()
            self.sent += 1
            self.reachable = True
            if pending.kind == "end":
                return
            pending, backoff = None, BACKOFF_S

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every queued event was sent (tests, the demo's summary); False when
        ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._q.unfinished_tasks == 0:
                return True
            time.sleep(0.05)
        return False


_LIVE: "weakref.WeakSet[Tracker]" = weakref.WeakSet()


def trackers() -> list["Tracker"]:
    """The ``Tracker`` objects of this process that still exist (closed ones included until
    they are collected)."""
    return list(_LIVE)


def _refused(exc: BaseException) -> bool:
    """True when the server answered with an error (``RestException``: a bad request, a
    changed param), as opposed to a server that did not answer (kept and retried)."""
    try:
        from mlflow.exceptions import RestException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, RestException)


def _tags(d: Mapping[str, str]):
    from mlflow.entities import RunTag

    return [RunTag(k, v) for k, v in d.items()]


def start(uri: Optional[str], run_name: str, tags: Optional[Mapping[str, Any]] = None,
          run_id_file: Optional[RunIdFile] = None) -> "Tracker | NullTracker":
    """A ``Tracker`` when ``uri`` (or ``$MLFLOW_TRACKING_URI``) is set, else ``NullTracker``."""
    uri = tracking_uri(uri)
    if not uri:
        return NullTracker()
    return Tracker(uri, run_name, tags=tags, run_id_file=run_id_file)


# -- what the trainer logs (module docstring) ---------------------------------------------
def _flat(v: Any) -> Any:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


def start_training(cfg, job: Mapping[str, Any], uri: Optional[str] = None) -> "Tracker | NullTracker":
    """The tracker of one trainer process of a training job.

    Args:
        cfg: the job's ``runtime.trainer.config.TrainConfig`` (logged as params by trainer 0).
        job: the record's job fields: ``mode`` (``ps``/``single``), ``trainers``,
            ``pservers``, ``trainer_id`` (PS; absent = 0).
        uri: the tracking URI (default: ``$MLFLOW_TRACKING_URI``; none: ``NullTracker``).

    A continuous job keeps its run id under ``cfg.state_dir`` (resume: same run)."""
    uri = tracking_uri(uri)
    if not uri:
        return NullTracker()
    tid = int(job.get("trainer_id") or 0)
    continuous = cfg.mode == "continuous"
    job_name = (f"online-{cfg.start_hour.replace('/', '-')}" if continuous
                else f"train-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    name = job_name if tid == 0 else f"{job_name}-trainer{tid}"
    tags = {"elastic_ctr.role": "trainer", "elastic_ctr.trainer_id": tid, "elastic_ctr.mode": cfg.mode,
            "elastic_ctr.job": job_name}
    rfile = RunIdFile(cfg.state_dir, f"trainer-{tid}") if continuous and cfg.state_dir else None
    tr = Tracker(uri, name, tags=tags, run_id_file=rfile)
    if tid == 0:
        params = {k: _flat(v) for k, v in cfg.model_dump().items() if v is not None}
        params.update(trainers=job.get("trainers"), pservers=job.get("pservers"), job_mode=job.get("mode"))
        tr.log_params(params)
    return tr


def partition_step(start_hour: str, hour: str) -> int:
    """A continuous job's step: hours from ``start_hour`` to ``hour`` (``YYYYMMDD/HH``)."""
    from runtime.formats.partitions import Hour

    return int((Hour.parse(hour).start - Hour.parse(start_hour).start).total_seconds() // 3600)


def log_partition(tr, step: int, part, loss: Optional[float] = None) -> None:
    """One trained partition (``runtime.formats.train_result.PartitionResult``) at ``step``:
    ``PARTITION_METRICS``."""
    eps = part.rows / part.seconds if part.seconds else None
    tr.log_metrics({"auc_before": part.auc_before, "train_auc": part.train_auc, "loss": finite(loss),
                    "rows": part.rows, "seconds": part.seconds, "examples_per_s": eps}, step=step)


def log_version(tr, step: Optional[int], rec: Mapping[str, Any], model_meta: Optional[dict]) -> None:
    """One exported version: ``rec`` = ``{"id", "kind", "base", "hour", "rows", "seconds"}``
    (``runtime.trainer.online.ExportRecord``; batch: ``hour`` None); ``EXPORT_METRICS`` at
    ``step``, the ``version.<id>.*`` tags and the ``versions/<id>.json`` artifact."""
    vid = rec["id"]
    tr.log_metrics({"export_rows": rec.get("rows"), "export_seconds": rec.get("seconds"), "version_id": vid},
                   step=step)
    tr.set_tags({f"version.{vid}.kind": rec.get("kind"), f"version.{vid}.base": rec.get("base"),
                 f"version.{vid}.hour": rec.get("hour")})
    tr.log_dict({**dict(rec), "model_meta": model_meta}, f"versions/{vid}.json")


def finite(v: Optional[float]) -> Optional[float]:
    """``v`` when it is a finite number, else None (MLflow takes no NaN loss)."""
    import math

    return v if v is not None and math.isfinite(v) else None


def published_model_meta(output: Optional[str], version: int) -> Optional[dict]:
    """The ``model_meta.json`` of ``version`` as published under ``output`` (a local root
    or URL; ``runtime.formats.donefile.dense_dir``), for the version's artifact; None when
    there is no output or it cannot be read (warned: tracking never fails a job)."""
    if not output:
        return None
    from runtime import storage
    from runtime.formats import donefile, model_meta

    where = storage.join(output, donefile.dense_dir(version), model_meta.FILE)
    try:
        return json.loads(storage.read_bytes(where))
    except (OSError, ValueError) as exc:
        log.warning("tracking: %s not read (%s); the version's artifact has no model_meta", where, exc)
        return None


# -- what the cube transfer logs (module docstring) ---------------------------------------
def start_transfer(work_dir: str, dict_name: str, uri: Optional[str] = None) -> "Tracker | NullTracker":
    """The cube transfer's tracker: one run per transfer (``transfer-<dict>``), its id
    kept in ``<work_dir>/tracking/transfer.json`` so a restarted transfer continues it."""
    uri = tracking_uri(uri)
    if not uri:
        return NullTracker()
    return Tracker(uri, f"transfer-{dict_name}", tags={"elastic_ctr.role": "transfer", "elastic_ctr.dict": dict_name},
                   run_id_file=RunIdFile(str(work_dir), "transfer"))


def log_rollout(tr, version: int, mode: str, seconds: float, phases: Mapping[str, float]) -> None:
    """One finished rollout, step = the version id: ``rollout_seconds`` and
    ``<phase>_seconds`` per phase (``runtime.cube.transfer.state.Phase`` values, lower
    case: ``building``, ``deploying``, ``downloading``, ``reloading``, ``enabling``), and the
    tag ``version.<id>.kind`` (``mode``: base/patch)."""
    tr.log_metrics({"rollout_seconds": seconds, **{f"{k.lower()}_seconds": s for k, s in phases.items()}},
                   step=int(version))
    tr.set_tags({f"version.{int(version)}.kind": mode})
