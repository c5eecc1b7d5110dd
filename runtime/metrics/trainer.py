"""The training job's Prometheus metrics: every trainer process's (``TrainerMetrics``, served
on ``/metrics`` by ``serve_from_env``) and each pserver's (``pserver_exporter``: a small
process beside it, since ``fleet.run_server()`` holds the GIL for good and no thread of the
pserver itself ever answers a scrape).

The port is ``$ELASTIC_CTR_METRICS_PORT`` (``runtime.role_specs.METRICS_PORT_ENV``: the pods'
``metrics`` port, a free one per local process, on 127.0.0.1 there:
``$ELASTIC_CTR_METRICS_HOST``); unset or 0: no endpoint, and the metrics
are still kept (cheap) so the code paths are the same.

Families (``elastic_ctr_trainer_*``; "trainer 0" ones are set by the chief only):

* ``examples_total``, ``pass_seconds`` (histogram), ``pass_examples_per_second`` (the last
  pass), ``loss`` (the last pass's last batch);
* ``partitions_trained_total``, ``partitions_waiting`` (trainer 0: complete partitions not
  trained yet, counted at scrape time, at most ``WAITING_CAP``),
  ``trained_data_end_timestamp_seconds`` (the end of the last partition trained, unix s),
  ``partitions_quarantined_total`` (trainer 0: partitions the data gate refused, not
  trained; ``runtime.trainer.data_gate``);
* ``auc{stage}`` (``before_training``: trainer 0's AUC of the model on a partition before
  training on it, the next-hour AUC; ``training``: over the pass);
* ``exports_total{kind}``, ``export_seconds{kind}`` (histogram), ``export_rows_total{kind}``,
  ``exported_version``, ``exported_data_end_timestamp_seconds`` (trainer 0; ``kind`` base |
  patch);
* ``onnx_exports_total{result}`` (trainer 0: each version's ONNX copy, ``result`` ok |
  conversion_failed | check_failed; a failed one is published for Paddle Inference alone,
  ``runtime.trainer.onnx_export``);
* ``elastic_ctr_pserver_table_rows{pserver}`` (trainer 0: rows of each pserver's sparse
  table, admitted feasigns or not, at the last full save or shrink point, counted from its
  ``part-<pserver>-*`` files);
* the feature lifecycle (trainer 0; ``runtime.trainer.lifecycle``): ``served_rows`` (keys
  of the served chain: the admitted feasigns exported), ``feasigns_admitted_total`` and
  ``feasigns_deleted_total`` (keys each export added to and deleted from the served
  chain), ``feasigns_evicted_total`` (rows the shrink points removed from the parameter
  servers), ``shrink_seconds`` (histogram: each shrink point, wall);
* the process's ``process_*`` families (memory, CPU) and its MLflow client's
  (``runtime.metrics.tracking``).

The pserver's exporter serves ``process_*`` of the pserver's PID (resident memory, CPU).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from runtime.metrics import NAMESPACE, no_created_series

log = logging.getLogger(__name__)

#: partitions counted by ``partitions_waiting`` at most (each is one completeness check)
WAITING_CAP = 48
#: seconds a ``partitions_waiting`` count is reused by the next scrapes
WAITING_TTL_S = 15.0
_SECONDS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class TrainerMetrics:
    """The families of one trainer process (module docstring), in ``registry``."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        from runtime.metrics.tracking import TrackingCollector

        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.tracking = TrackingCollector()
        r.register(self.tracking)
        ns, sub = NAMESPACE, "trainer"
        self.examples = Counter("examples", "examples trained", namespace=ns, subsystem=sub, registry=r)
        self.pass_seconds = Histogram("pass_seconds", "wall seconds of each training pass", namespace=ns,
                                      subsystem=sub, buckets=_SECONDS, registry=r)
        self.pass_rate = Gauge("pass_examples_per_second", "examples per second of the last pass", namespace=ns,
                               subsystem=sub, registry=r)
        self.loss = Gauge("loss", "the last pass's last batch loss", namespace=ns, subsystem=sub, registry=r)
        self.partitions = Counter("partitions_trained", "partitions trained", namespace=ns, subsystem=sub,
                                  registry=r)
        self.quarantined = Counter("partitions_quarantined", "partitions the data gate refused (not trained)",
                                   namespace=ns, subsystem=sub, registry=r)
        self.gate_adaptations = Counter("gate_adaptations", "lasting shifts of the data the data gate took as the "
                                        "new normal (--gate-adapt-after)", namespace=ns, subsystem=sub, registry=r)
        self.trained_data_end = Gauge("trained_data_end_timestamp_seconds",
                                      "end of the last partition trained (unix s; NaN: none yet)", namespace=ns,
                                      subsystem=sub, registry=r)
        self.auc = Gauge("auc", "AUC per partition: before_training (trainer 0, the model before training on "
                                "it) and training (over the pass)", ["stage"], namespace=ns, subsystem=sub,
                         registry=r)
        self.exports = Counter("exports", "versions exported", ["kind"], namespace=ns, subsystem=sub, registry=r)
        self.export_seconds = Histogram("export_seconds", "seconds from an export point to its version "
                                        "published", ["kind"], namespace=ns, subsystem=sub, buckets=_SECONDS,
                                        registry=r)
        self.export_rows = Counter("export_rows", "sparse rows exported", ["kind"], namespace=ns, subsystem=sub,
                                   registry=r)
        self.exported_version = Gauge("exported_version", "id of the last version exported", namespace=ns,
                                      subsystem=sub, registry=r)
        self.exported_data_end = Gauge("exported_data_end_timestamp_seconds",
                                       "data time of the last version exported: the end of its last partition "
                                       "(unix s; NaN: none yet)", namespace=ns, subsystem=sub, registry=r)
        self.onnx_exports = Counter("onnx_exports", "ONNX copies of exported versions' dense models by result (ok, "
                                    "conversion_failed, check_failed: published for Paddle Inference alone)",
                                    ["result"], namespace=ns, subsystem=sub, registry=r)
        for g in (self.trained_data_end, self.exported_data_end, self.exported_version, self.loss):
            g.set(float("nan"))
        self.table_rows = Gauge("table_rows", "sparse-table rows of each pserver (admitted feasigns or not) at "
                                "the last full save or shrink point", ["pserver"], namespace=ns, subsystem="pserver",
                                registry=r)
        self.served_rows = Gauge("served_rows", "keys of the served chain: the admitted feasigns exported "
                                 "(trainer 0; NaN: not known before the first base of this process)", namespace=ns,
                                 subsystem=sub, registry=r)
        self.served_rows.set(float("nan"))
        self.admitted = Counter("feasigns_admitted", "keys the exports added to the served chain (feasigns "
                                "admitted)", namespace=ns, subsystem=sub, registry=r)
        self.deleted = Counter("feasigns_deleted", "keys the exports deleted from the served chain (evicted, or "
                               "no longer holding an embedding)", namespace=ns, subsystem=sub, registry=r)
        self.evicted = Counter("feasigns_evicted", "rows the shrink points evicted from the parameter servers' "
                               "table", namespace=ns, subsystem=sub, registry=r)
        self.shrink_seconds = Histogram("shrink_seconds", "wall seconds of each shrink point (decay, eviction, "
                                        "the unseen-count tick)", namespace=ns, subsystem=sub, buckets=_SECONDS,
                                        registry=r)
        self._waiting: Optional[Callable[[], int]] = None
        self._waiting_cache: tuple[float, float] = (0.0, 0.0)
        waiting = Gauge("partitions_waiting", "complete partitions not trained yet (trainer 0)", namespace=ns,
                        subsystem=sub, registry=r)
        waiting.set_function(self._count_waiting)

    # -- what the training code reports -----------------------------------------------------
    def pass_done(self, examples: int, seconds: float, train_auc: float, loss: float) -> None:
        """One training pass: ``examples`` trained in ``seconds`` (wall), its AUC and last loss."""
        self.examples.inc(examples)
        self.pass_seconds.observe(seconds)
        self.pass_rate.set(examples / max(seconds, 1e-9))
        self.auc.labels("training").set(train_auc)
        if loss == loss:  # NaN: not reported
            self.loss.set(loss)

    def partition_done(self, end_s: float, auc_before: Optional[float]) -> None:
        """A partition trained: its end (unix s) and, on trainer 0, the AUC before training."""
        self.partitions.inc()
        self.trained_data_end.set(end_s)
        if auc_before is not None:
            self.auc.labels("before_training").set(auc_before)

    def export_done(self, kind: str, seconds: float, rows: int, version: int, data_end_s: Optional[float]) -> None:
        """A version published (trainer 0): ``kind`` base|patch, its seconds, rows, id and data time."""
        self.exports.labels(kind).inc()
        self.export_seconds.labels(kind).observe(seconds)
        self.export_rows.labels(kind).inc(rows)
        self.exported_version.set(version)
        if data_end_s is not None:
            self.exported_data_end.set(data_end_s)

    def onnx_export(self, result: str) -> None:
        """A version's ONNX copy (trainer 0): ``result`` ok | conversion_failed | check_failed."""
        self.onnx_exports.labels(result).inc()

    def shrink_done(self, rows_per_pserver: dict[int, int], evicted: Optional[int], seconds: float) -> None:
        """A shrink point (trainer 0): the table's rows per pserver index after it, the rows
        it evicted (None: not known) and its wall seconds."""
        self.table_saved(rows_per_pserver)
        if evicted:
            self.evicted.inc(evicted)
        self.shrink_seconds.observe(seconds)

    def served_changed(self, served_rows: Optional[int], admitted: int, deleted: int) -> None:
        """An export published (trainer 0): the served chain's keys (None: not known), the
        keys it added and deleted."""
        self.served_rows.set(float("nan") if served_rows is None else served_rows)
        self.admitted.inc(admitted)
        self.deleted.inc(deleted)

    def table_saved(self, rows_per_pserver: dict[int, int]) -> None:
        """A full table save's rows per pserver index (trainer 0)."""
        for p, n in rows_per_pserver.items():
            self.table_rows.labels(str(p)).set(n)

    def count_waiting(self, fn: Optional[Callable[[], int]]) -> None:
        """Sets how ``partitions_waiting`` is counted at scrape time (trainer 0; None: 0)."""
        self._waiting = fn
        self._waiting_cache = (0.0, 0.0)

    def _count_waiting(self) -> float:
        fn = self._waiting
        if fn is None:
            return 0.0
        at, value = self._waiting_cache
        if time.monotonic() - at < WAITING_TTL_S:
            return value
        try:
            value = float(fn())
        except Exception as exc:  # noqa: BLE001 - a scrape never fails the job
            log.debug("partitions_waiting not counted: %s", exc)
        self._waiting_cache = (time.monotonic(), value)
        return value


def waiting_counter(root: str, first) -> Callable[[], int]:
    """A count of the complete partitions under ``root`` from ``first()`` on (a
    ``runtime.formats.partitions.Hour``, read at each call), consecutive, at most
    ``WAITING_CAP``."""
    from runtime.formats import partitions

    def count() -> int:
        h, n = first(), 0
        while n < WAITING_CAP and partitions.is_complete(root, h):
            n, h = n + 1, h.next()
        return n

    return count


_METRICS: Optional[TrainerMetrics] = None
_LOCK = threading.Lock()


def metrics() -> TrainerMetrics:
    """This process's ``TrainerMetrics`` (made at the first call)."""
    global _METRICS
    with _LOCK:
        if _METRICS is None:
            _METRICS = TrainerMetrics()
        return _METRICS


def metrics_port() -> int:
    """``$ELASTIC_CTR_METRICS_PORT`` (0 when unset). Raises ``ValueError`` naming the
    variable when it is not a port number."""
    from runtime.role_specs import METRICS_PORT_ENV

    raw = os.environ.get(METRICS_PORT_ENV, "").strip() or "0"
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{METRICS_PORT_ENV}: {raw!r} is not a port number (0-65535)")
    return int(raw)


def metrics_host() -> str:
    """``$ELASTIC_CTR_METRICS_HOST``, default every address (``0.0.0.0``, a pod's)."""
    from runtime.role_specs import ANY_HOST, METRICS_HOST_ENV

    return os.environ.get(METRICS_HOST_ENV, "").strip() or ANY_HOST


def serve_from_env():
    """Serves this trainer's metrics on ``$ELASTIC_CTR_METRICS_HOST:$ELASTIC_CTR_METRICS_PORT``
    (a daemon thread, prometheus_client's server); returns the server, or None when no port
    is set or it cannot be bound (warned: metrics never stop training)."""
    port, host = metrics_port(), metrics_host()
    if not port:
        return None
    from prometheus_client import start_http_server

    no_created_series()
    try:
        server, _ = start_http_server(port, host, registry=metrics().registry)
    except OSError as exc:  # metrics never stop training: said once, the job goes on
        log.warning("trainer metrics: cannot listen on %s:%d (%s); no /metrics for this process", host, port, exc)
        return None
    log.info("trainer metrics on http://%s:%d/metrics", host, port)
    return server


def pserver_exporter() -> Optional[subprocess.Popen]:
    """Starts the exporter of this pserver process (``python -m runtime.metrics.trainer
    --pid <this pid>``) on ``$ELASTIC_CTR_METRICS_HOST:$ELASTIC_CTR_METRICS_PORT``; it exits
    once this process is gone. Returns it, or None when no port is set."""
    port, host = metrics_port(), metrics_host()
    if not port:
        return None
    return subprocess.Popen([sys.executable, "-m", "runtime.metrics.trainer", "--pid", str(os.getpid()),
                             "--host", host, "--port", str(port)], stdin=subprocess.DEVNULL)


def _exporter(pid: int, host: str, port: int, poll_s: float = 1.0) -> int:
    """The pserver exporter's loop: ``process_*`` of ``pid`` on ``host:port`` until ``pid``
    is gone (or this process's parent changed)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    reg = CollectorRegistry()
    ProcessCollector(pid=lambda: pid, registry=reg)
    start_http_server(port, host, registry=reg)
    parent = os.getppid()
    while os.getppid() == parent:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(poll_s)
    return 0


if __name__ == "__main__":  # the pserver's exporter (pserver_exporter)
    import argparse

    ap = argparse.ArgumentParser(description="Prometheus exporter of one pserver process")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    sys.exit(_exporter(a.pid, a.host, a.port))
