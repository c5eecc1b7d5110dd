"""The harness's errors: what it cannot do, and a rendered field it does not know how to play."""
from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness cannot do what was asked (engine error, timeout, bad input)."""


class UnsupportedField(HarnessError):
    """A rendered field the harness does not know how to play; ``path`` names it
    (e.g. ``Deployment/serving.spec.template.spec.hostNetwork``)."""

    def __init__(self, path: str, why: str = "not known to the harness (and not in schema.IGNORED)"):
        super().__init__(f"{path}: {why}")
        self.path = path
