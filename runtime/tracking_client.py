"""A non-blocking MLflow client (``Tracker``): the transport of ``runtime.tracking``, which
owns what is logged (names, steps, runs).

A ``Tracker`` never blocks the caller: ``log_params`` / ``log_metrics`` / ``set_tags`` /
``log_dict`` / ``log_inputs`` put an event on a bounded queue (``QUEUE_SIZE``) and return; a
daemon thread sends the events in order through ``mlflow.MlflowClient`` (imported lazily,
only when a tracking URI is set: ``mlflow-skinny`` is enough). Each HTTP request is
bounded by ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default here ``REQUEST_TIMEOUT_S``) with
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` retries (default here 0: the thread retries itself).
When the server is down or slow the thread warns once, keeps the failed event and retries
it after a backoff (``BACKOFF_S`` doubling up to ``MAX_BACKOFF_S``), so the run catches up
when the server returns; events that arrive while the queue is full are dropped and
counted (``dropped``). ``close(timeout_s)`` waits at most ``timeout_s`` for the queue to
drain; what is left is counted as dropped and reported in one warning.

A run may be a child of a job's run (``parent_job``): when the thread creates it, it takes
the parent's id from ``parent_id()`` when given (the job's run made in the same process, or
its run id file on a shared state directory, ``runtime.tracking_runfile``), else looks up
the newest run with the job's tags (``ROLE_TAG`` = ``job``, ``JOB_TAG`` = the job's name)
started at most ``PARENT_LOOKBACK_S`` before this tracker; it waits up to ``PARENT_WAIT_S``
for the parent to exist, and tags the run with ``mlflow.parentRunId`` (MLflow's UI nests it
there); without a parent by then the run is made alone, with a warning.

Environment: ``MLFLOW_TRACKING_URI`` (no URI: ``start`` returns ``NullTracker``, nothing
imported), ``MLFLOW_EXPERIMENT_NAME`` (default ``DEFAULT_EXPERIMENT``); the login
(``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``) is set from the ``tracking`` credential
(``runtime.tracking_login``) before the first request. The MLflow entities and calls the
thread builds on are ``runtime.tracking_mlflow``'s.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from runtime import tracking_mlflow
from runtime.tracking_runfile import RunIdFile

log = logging.getLogger(__name__)

URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "elastic-ctr"
QUEUE_SIZE = 10_000
REQUEST_TIMEOUT_S = 5.0
BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
CLOSE_TIMEOUT_S = 10.0

#: seconds a child run waits for its parent to exist before it is made without one
PARENT_WAIT_S = 60.0
#: a job's run found by its tags is at most this older than the child's tracker (seconds)
PARENT_LOOKBACK_S = 3600.0
#: the tags MLflow reads: a run's parent (its UI nests the run under it), the code's version
PARENT_TAG, COMMIT_TAG = "mlflow.parentRunId", "mlflow.source.git.commit"
#: the tags that name a job's parent run (``runtime.tracking``)
ROLE_TAG, JOB_TAG = "elastic_ctr.role", "elastic_ctr.job"


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
    kind: str  # params | metrics | tags | dict | inputs | end
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

    def log_inputs(self, datasets: list[tuple[str, str, str, str]]) -> None:
        pass

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S, status: str = "FINISHED") -> int:
        return 0


class Tracker:
    """A non-blocking MLflow run (module docstring).

    Args:
        uri: the tracking URI (``http://host:port``, ``file:...``, ``sqlite:...``).
        run_name: the run's name (a new run only).
        experiment: the experiment's name (created if missing).
        tags: tags set when the run is created or resumed.
        run_id_file: where the run id is kept (resume), or None.
        queue_size: events held before new ones are dropped.
        parent_job: the job whose run (tags ``ROLE_TAG`` job, ``JOB_TAG`` its name) is this
            run's parent (module docstring), or None.
        parent_id: the parent run's id when known (a callable, None until it is).

    The run is created (or resumed) by the thread, so the constructor never waits on the
    server. ``run_id`` is None until then (and stays None while the server is down).
    ``reachable``: None before the first request, then whether the last one got an answer
    (``runtime.metrics.tracking`` exposes it with ``sent``, ``dropped`` and ``failures``).
    """

    def __init__(self, uri: str, run_name: str, experiment: Optional[str] = None,
                 tags: Optional[Mapping[str, Any]] = None, run_id_file: Optional[RunIdFile] = None,
                 queue_size: int = QUEUE_SIZE, parent_job: Optional[str] = None,
                 parent_id: Optional[Callable[[], Optional[str]]] = None):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(REQUEST_TIMEOUT_S)))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        self.uri = uri
        self.run_name = run_name
        self.experiment = experiment or experiment_name()
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self.run_id_file = run_id_file
        self.parent_job, self.parent_id = parent_job, parent_id
        self._born, self._born_wall = time.monotonic(), time.time()
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

    def log_inputs(self, datasets: list[tuple[str, str, str, str]]) -> None:
        """Datasets the run used (``mlflow.data``): ``(name, location, digest, context)``
        each, the location a path or URL (its MLflow dataset source is resolved from it),
        ``context`` e.g. ``training``."""
        self._put(_Event("inputs", list(datasets)))

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
            from runtime import tracking_login

            tracking_login.login()  # basic auth from the tracking credential, if configured
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
            exp_id = tracking_mlflow.experiment_id(client, self.experiment)
            tags = dict(self.tags)
            if self.parent_job:
                parent = self._parent(client, exp_id)
                if parent is not None:
                    tags[PARENT_TAG] = parent
            run = client.create_run(exp_id, tags=tags, run_name=self.run_name)
            run_id = run.info.run_id
            log.info("tracking: run %s (%s) at %s, experiment %s", run_id, self.run_name, self.uri, self.experiment)
        else:
            exp_id = client.get_run(run_id).info.experiment_id
            if self.tags:
                client.log_batch(run_id, tags=tracking_mlflow.run_tags(self.tags))
        if self.run_id_file is not None:
            self.run_id_file.write(self.uri, run_id, exp_id)
        self._client, self.run_id = client, run_id

    def _parent(self, client, exp_id: str) -> Optional[str]:
        """The run id of the job ``parent_job`` (``parent_id()``, else the newest run tagged
        ``ROLE_TAG`` job and ``JOB_TAG`` the job); raises ``_ParentPending`` while it does
        not exist yet, ``PARENT_WAIT_S`` has not passed and the tracker is not closing; then
        None (warned)."""
        job = self.parent_job.replace("'", "")
        if self.parent_id is not None:
            found_id = self.parent_id()
            if found_id:
                return found_id
        else:
            since = int((self._born_wall - PARENT_LOOKBACK_S) * 1000)
            found = client.search_runs([exp_id], f"tags.`{ROLE_TAG}` = 'job' and tags.`{JOB_TAG}` = '{job}' and "
                                       f"attributes.start_time >= {since}", max_results=1,
                                       order_by=["attributes.start_time DESC"])
            if found:
                return found[0].info.run_id
        if time.monotonic() - self._born < PARENT_WAIT_S and not self._closing.is_set():
            raise _ParentPending(job)  # closing: no more waiting, the run is made now
        log.warning("tracking %s: no run of job %s after %.0f s; the run has no parent", self.run_name, job,
                    PARENT_WAIT_S)
        return None

    def _send(self, ev: _Event) -> None:
        from mlflow.entities import Metric, Param

        c, rid = self._client, self.run_id
        if ev.kind == "params":
            c.log_batch(rid, params=[Param(k, v) for k, v in ev.payload.items()])
        elif ev.kind == "metrics":
            c.log_batch(rid, metrics=[Metric(k, v, ev.ts_ms, ev.step or 0) for k, v in ev.payload.items()])
        elif ev.kind == "tags":
            c.log_batch(rid, tags=tracking_mlflow.run_tags(ev.payload))
        elif ev.kind == "dict":
            c.log_dict(rid, ev.payload[0], ev.payload[1])
        elif ev.kind == "inputs":
            c.log_inputs(rid, datasets=[tracking_mlflow.dataset_input(*d) for d in ev.payload])
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
            except _ParentPending:  # the parent's run is not made yet: ask again later, quietly
                self._closing.wait(min(backoff, 2.0))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            except Exception as exc:  # noqa: BLE001 - any failure of the server: warn, retry later
                self.failures += 1
                self.reachable = tracking_mlflow.refused(exc)
                if tracking_mlflow.refused(exc):  # the server answered: this event can never be taken
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


class _ParentPending(Exception):
    """The parent job's run does not exist yet (``Tracker._parent``)."""


_LIVE: "weakref.WeakSet[Tracker]" = weakref.WeakSet()


def trackers() -> list["Tracker"]:
    """The ``Tracker`` objects of this process that still exist (closed ones included until
    they are collected)."""
    return list(_LIVE)


def start(uri: Optional[str], run_name: str, tags: Optional[Mapping[str, Any]] = None,
          run_id_file: Optional[RunIdFile] = None) -> "Tracker | NullTracker":
    """A ``Tracker`` when ``uri`` (or ``$MLFLOW_TRACKING_URI``) is set, else ``NullTracker``."""
    uri = tracking_uri(uri)
    if not uri:
        return NullTracker()
    return Tracker(uri, run_name, tags=tags, run_id_file=run_id_file)
