"""Serving's data plane, independent of the transport and of any model (KServe's layout):
the models served, found by name; the server's readiness and metadata; and the dispatch
of model readiness, metadata and inference to the model named.

A model (``Model``) owns everything about itself: its signature (inputs and outputs:
names, datatypes, shapes), the checks of a request against it, its versions and how it
predicts. The transports (``runtime.serving.rest``, ``runtime.serving.grpc_server``)
decode a request with their codec into the protocol's data model
(``runtime.serving.protocol``), call the data plane, and encode its answer.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Iterable, Optional

from runtime.metrics.serving import ServingMetrics
from runtime.serving.protocol import InferRequest, InferResponse, NotFound

SERVER_NAME = "elastic-ctr"
SERVER_VERSION = "0.1.0"
#: the protocol extensions served (Triton's names), on both transports where they apply
EXTENSIONS = ["binary_tensor_data"]


class Model(abc.ABC):
    """A served model (KServe's ``Model``): ``name``, and what the data plane asks of it.

    Versions are strings, as the protocol names them. Errors are the protocol's
    (``runtime.serving.protocol``): ``BadRequest`` (400), ``NotFound`` (404),
    ``Unavailable`` (503).
    """

    name: str

    @abc.abstractmethod
    def versions(self) -> list[str]:
        """The versions answering now ([] while none is loaded)."""

    @abc.abstractmethod
    def ready(self) -> tuple[bool, str]:
        """``(ready, reason)``: whether it can answer now, and why not."""

    @abc.abstractmethod
    def metadata(self, version: Optional[str] = None) -> dict:
        """The v2 model metadata (name, versions, platform, inputs, outputs). Raises
        ``NotFound`` for a ``version`` not served."""

    @abc.abstractmethod
    def infer(self, req: InferRequest, version: Optional[str] = None) -> InferResponse:
        """Answers a v2 inference request (with ``version``, or the one answering now).
        Raises ``BadRequest``, ``NotFound``, ``Unavailable``."""

    def routes(self) -> dict[str, tuple[str, Callable[[bytes, str], Any]]]:
        """This model's own REST routes beside the protocol's: ``{path: (endpoint,
        handler)}``, each served for ``POST``; ``handler(body bytes, content type) ->
        a JSON-able answer`` (200), raising the protocol's errors; ``endpoint`` names the
        route in the metrics. None by default."""
        return {}


class DataPlane:
    """The prediction logic behind every transport (module docstring).

    Args:
        models: the models served; the first is the default (``default``).
        metrics: the process's Prometheus metrics (the transports count requests in them;
            default: new ones).
    """

    def __init__(self, models: Iterable[Model], metrics: Optional[ServingMetrics] = None):
        self.models: dict[str, Model] = {}
        for m in models:
            self.models[m.name] = m
        if not self.models:
            raise ValueError("a data plane needs at least one model")
        self.metrics = metrics or ServingMetrics()
        #: set once the process is stopping: readiness false from then on
        self.stopping = False

    @property
    def default(self) -> Model:
        """The first model."""
        return next(iter(self.models.values()))

    def model(self, name: str) -> Model:
        """The model ``name``. Raises ``NotFound``."""
        m = self.models.get(name)
        if m is None:
            have = ", ".join(repr(n) for n in self.models)
            raise NotFound(f"model {name!r} not found (this server has {have})")
        return m

    # -- health and metadata ---------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        """``(ready, reason)``: not stopping, and every model ready."""
        if self.stopping:
            return False, "shutting down"
        for m in self.models.values():
            ok, why = m.ready()
            if not ok:
                return False, why
        return True, "ready"

    def not_served(self, name: str, version: Optional[str] = None) -> Optional[str]:
        """Why model ``name`` cannot answer for ``version`` (None: any version) whatever
        the server's readiness, or None when it can: that version is not being served.
        Raises ``NotFound`` for an unknown model."""
        m = self.model(name)
        if version is not None and version not in m.versions():
            return f"model {name!r} version {version!r} is not being served"
        return None

    def model_ready(self, name: str, version: Optional[str] = None) -> tuple[bool, str]:
        """``(ready, reason)`` of model ``name`` (and ``version``) alone, as KServe answers
        a model's readiness: ``not_served``, else the model's own ``ready()`` (the server's,
        stopping included, is ``ready``). Raises ``NotFound`` for an unknown model."""
        why = self.not_served(name, version)
        return (False, why) if why else self.model(name).ready()

    def server_metadata(self) -> dict:
        """The v2 server metadata."""
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: Optional[str] = None) -> dict:
        """The v2 model metadata. Raises ``NotFound``."""
        return self.model(name).metadata(version)

    # -- inference -----------------------------------------------------------------------
    def infer(self, name: str, version: Optional[str], req: InferRequest) -> InferResponse:
        """Answers a v2 inference request with model ``name``. Raises ``BadRequest``,
        ``NotFound``, ``Unavailable``."""
        return self.model(name).infer(req, version)
