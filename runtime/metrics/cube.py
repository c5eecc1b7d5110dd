"""The cube's Prometheus metrics: the server's (``CubeServerCollector``, read from the
server's counters at scrape time: nothing is added to the lookup path) and the agent's
(``AgentMetrics``).

Server families (``elastic_ctr_cube_*``, every one labelled ``shard`` and ``shard_num``,
the server's ``--shard`` / ``--shard-num``, so a layout's shards and two layouts side by
side are told apart): ``requests_total`` (lookup requests answered), ``keys_total`` (keys
looked up), ``hits_total`` / ``misses_total`` (found / not found: a miss is served as a zero
vector), ``errors_total{status}`` (error replies by protocol status), ``served_version`` /
``previous_version`` (ids; 0: none), ``dict_keys`` (keys of the served version),
``version_bytes{slot}`` (memory of each version held: ``current``, ``previous`` (still
answered while a switch propagates), ``loading`` (the background slot)),
``connections`` (open data-plane connections), ``loads_total{result}``, ``enables_total``,
plus the process's ``process_*`` (resident memory, CPU).

Agent families (``elastic_ctr_cube_agent_*``): ``step_seconds{step}`` (histogram of each
step's duration: ``download``, ``reload``, ``enable``), ``steps_total{step,result}``
(``ok`` | ``failed``), ``bytes_total{step}`` (``download``: the shard tars' bytes;
``reload``: the bytes of the dicts unpacked and loaded), ``enabled_version``.
"""
from __future__ import annotations

from runtime.metrics import NAMESPACE

_STEP_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class CubeServerCollector:
    """The server families above, read from ``server`` (a ``runtime.cube.server.core.
    CubeServer``: its ``status()``, ``versions`` and ``shard``/``shard_num``) at each scrape."""

    def __init__(self, server):
        self.server = server

    def describe(self):
        return []  # families are built at collect time (no second read of the server)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.server
        st, versions = s.status(), s.versions
        ns = f"{NAMESPACE}_cube"
        shard = [str(s.shard), str(s.shard_num)]
        names = ["shard", "shard_num"]

        def counter(name, doc, value):
            f = CounterMetricFamily(f"{ns}_{name}", doc, labels=names)
            f.add_metric(shard, value)
            return f

        def gauge(name, doc, value):
            f = GaugeMetricFamily(f"{ns}_{name}", doc, labels=names)
            f.add_metric(shard, value)
            return f

        yield counter("requests", "lookup requests answered", st["requests"])
        yield counter("keys", "keys looked up", st["keys_looked_up"])
        yield counter("hits", "keys found", st["hits"])
        yield counter("misses", "keys not found (answered as zero vectors)", st["keys_looked_up"] - st["hits"])
        e = CounterMetricFamily(f"{ns}_errors", "error replies by protocol status", labels=names + ["status"])
        for k, v in st["errors"].items():
            e.add_metric(shard + [k], v)
        yield e
        yield gauge("served_version", "served version id (0: none)", st["version"] or 0)
        yield gauge("previous_version", "previous version, still answered (0: none)", st["prev_version"] or 0)
        yield gauge("dict_keys", "keys in the served version", st["keys"])
        yield gauge("connections", "open data-plane connections", st["connections"])
        mem = GaugeMetricFamily(f"{ns}_version_bytes", "memory of each version held (bytes): current, previous, "
                                "loading", labels=names + ["slot"])
        cur, prev = versions.served
        for slot, held in (("current", cur), ("previous", prev), ("loading", versions.bg)):
            mem.add_metric(shard + [slot], float(held.t.nbytes) if held is not None else 0.0)
        yield mem
        lo = CounterMetricFamily(f"{ns}_loads", "background loads by result", labels=names + ["result"])
        for k, v in versions.loads.items():
            lo.add_metric(shard + [k], v)
        yield lo
        yield counter("enables", "version switches", versions.enables)


def server_registry(server):
    """A registry with the server's families and its process's ``process_*``."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry()
    registry.register(CubeServerCollector(server))
    ProcessCollector(registry=registry)
    return registry


class AgentMetrics:
    """The agent families above, in ``registry`` (with the process's ``process_*``)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        from runtime.metrics.auth import AuthMetrics

        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.auth = AuthMetrics(r)  # the control port's credential refusals
        ns, sub = NAMESPACE, "cube_agent"
        self.seconds = Histogram("step_seconds", "seconds of each step (download, reload, enable)", ["step"],
                                 namespace=ns, subsystem=sub, buckets=_STEP_SECONDS, registry=r)
        self.steps = Counter("steps", "steps by result (ok, failed)", ["step", "result"], namespace=ns,
                             subsystem=sub, registry=r)
        self.bytes = Counter("bytes", "bytes downloaded (download) and loaded (reload)", ["step"], namespace=ns,
                             subsystem=sub, registry=r)
        self.version = Gauge("enabled_version", "the version last enabled (0: none)", namespace=ns, subsystem=sub,
                             registry=r)
        for step in ("download", "reload", "enable"):  # every series exists from the start (rates, alerts)
            for result in ("ok", "failed"):
                self.steps.labels(step, result)
            self.seconds.labels(step)
        for step in ("download", "reload"):
            self.bytes.labels(step)

    def step_done(self, step: str, seconds: float, ok: bool, nbytes: int = 0) -> None:
        """One step finished: its seconds, whether it succeeded and the bytes it moved."""
        self.steps.labels(step, "ok" if ok else "failed").inc()
        self.seconds.labels(step).observe(seconds)
        if ok and nbytes and step in ("download", "reload"):
            self.bytes.labels(step).inc(nbytes)
