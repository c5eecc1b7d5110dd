"""The file server's Prometheus metrics (``elastic_ctr_fileserver_*``): ``requests_total
{method,code}`` (every answer, ``/metrics`` and the probes included), ``sent_bytes_total``
(bodies of GET answers whose length is known), ``uploaded_bytes_total`` (files stored by
PUT), ``elastic_ctr_auth_refusals_total`` (``runtime.metrics.auth``), plus the process's
``process_*``."""
from __future__ import annotations

from runtime.metrics import NAMESPACE


class FileServerMetrics:
    """The families above, in ``registry``."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, ProcessCollector

        from runtime.metrics.auth import AuthMetrics

        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.auth = AuthMetrics(r)  # the credential refusals (uploads; reads with --read-auth)
        ns, sub = NAMESPACE, "fileserver"
        self.requests = Counter("requests", "requests answered by method and HTTP status", ["method", "code"],
                                namespace=ns, subsystem=sub, registry=r)
        self.sent = Counter("sent_bytes", "bytes of GET answers' bodies", namespace=ns, subsystem=sub, registry=r)
        self.uploaded = Counter("uploaded_bytes", "bytes of the files stored by PUT", namespace=ns, subsystem=sub,
                                registry=r)

    def answered(self, method: str, code: int, body_bytes: int | None) -> None:
        """One answer (``body_bytes``: its length when known)."""
        method = method if method in ("GET", "HEAD", "PUT") else "other"
        self.requests.labels(method, str(code)).inc()
        if method == "GET" and body_bytes:
            self.sent.inc(body_bytes)
