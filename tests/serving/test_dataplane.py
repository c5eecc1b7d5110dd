"""The generic data plane: models found by name, readiness over every model, metadata and
inference dispatched to the model named; no CTR knowledge (a stand-in model here)."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.serving.dataplane import DataPlane, Model
from runtime.metrics.serving import ServingMetrics
from runtime.serving.protocol import InferInput, InferOutput, InferRequest, InferResponse, NotFound


class Echo(Model):
    """Answers its one input back; ready when told."""

    def __init__(self, name: str, ok: bool = True):
        self.name, self.ok = name, ok

    def versions(self) -> list[str]:
        return ["7"]

    def ready(self) -> tuple[bool, str]:
        return self.ok, "ready" if self.ok else f"{self.name} not loaded"

    def metadata(self, version=None) -> dict:
        return {"name": self.name, "versions": self.versions()}

    def infer(self, req: InferRequest, version=None) -> InferResponse:
        x = req.inputs[0].array()
        return InferResponse(self.name, "7", [InferOutput("y", "FP32", [x.size], x)])


def test_finds_models_by_name_and_dispatches():
    a, b = Echo("a"), Echo("b", ok=False)
    plane = DataPlane([a, b], ServingMetrics())
    assert plane.default is a and plane.model("b") is b
    assert plane.model_metadata("b") == {"name": "b", "versions": ["7"]}
    req = InferRequest([InferInput("x", "FP32", [2], data=[1.0, 2.0])])
    assert plane.infer("a", None, req).model_name == "a"
    with pytest.raises(NotFound, match=r"model 'c' not found \(this server has 'a', 'b'\)"):
        plane.infer("c", None, req)
    assert plane.ready() == (False, "b not loaded")
    assert plane.model_ready("a", "8") == (False, "model 'a' version '8' is not being served")
    b.ok = True
    assert plane.ready() == (True, "ready") and plane.model_ready("a", "7") == (True, "ready")
    plane.stopping = True  # the server stops: its readiness turns false, a model's is its own (KServe's)
    assert plane.ready() == (False, "shutting down") and plane.model_ready("a") == (True, "ready")
    assert a.routes() == {} and not hasattr(a, "predict_lines")  # raw rows are the CTR model's
    assert np.array_equal(plane.infer("b", None, req).outputs[0].data, [1.0, 2.0])
