"""What a role's MLflow client did (``runtime.tracking.Tracker``: the trainers and the cube
transfer log to a tracking server), as Prometheus families read at scrape time:

* ``elastic_ctr_tracking_reachable``: 1 when the last request to the server got an answer,
  0 when it did not (the server down or unreachable); NaN before any request or with
  tracking off (the lowest over the process's clients);
* ``elastic_ctr_tracking_events_sent_total``, ``elastic_ctr_tracking_events_dropped_total``
  (the queue was full, or still held events at close), ``elastic_ctr_tracking_failures_total``
  (requests that failed, each retried), summed over the process's clients.
"""
from __future__ import annotations

from runtime.metrics import NAMESPACE


class TrackingCollector:
    """A collector of the families above over ``runtime.tracking.trackers()``."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from runtime import tracking

        live = tracking.trackers()
        ns = f"{NAMESPACE}_tracking"
        states = [t.reachable for t in live if t.reachable is not None]
        yield GaugeMetricFamily(f"{ns}_reachable", "1: the tracking server answered the last request; 0: it "
                                "did not; NaN: no request yet", value=float(min(states)) if states else float("nan"))
        yield CounterMetricFamily(f"{ns}_events_sent", "events sent to the tracking server",
                                  value=sum(t.sent for t in live))
        yield CounterMetricFamily(f"{ns}_events_dropped", "events dropped (queue full, or left at close)",
                                  value=sum(t.dropped for t in live))
        yield CounterMetricFamily(f"{ns}_failures", "requests to the tracking server that failed (retried)",
                                  value=sum(t.failures for t in live))
