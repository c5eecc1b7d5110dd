"""The refusals of the roles' credential checks (``runtime.auth.Guard``):
``elastic_ctr_auth_refusals_total{role,endpoint,reason}``, in the registry of each role
that checks credentials (cube server, cube agent, file server). ``endpoint`` is the
route's rule (``/download``, ``/enable``, ``/<path:rel>``; ``other`` for an unknown path),
``reason`` one of ``missing``, ``malformed``, ``wrong``, ``unconfigured``
(``runtime.auth``)."""
from __future__ import annotations

from runtime.metrics import NAMESPACE


class AuthMetrics:
    """The refusals counter, registered in ``registry``."""

    def __init__(self, registry):
        from prometheus_client import Counter

        self.refusals = Counter("auth_refusals", "requests refused 401 by the credential check, by role, route "
                                "and reason", ["role", "endpoint", "reason"], namespace=NAMESPACE, subsystem="",
                                registry=registry)

    def refused(self, role: str, endpoint: str, reason: str) -> None:
        """One refusal."""
        self.refusals.labels(role, endpoint, reason).inc()
