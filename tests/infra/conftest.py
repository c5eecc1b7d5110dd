"""Fixtures for the Pulumi program's tests: cached offline renderings (mocks, in-process),
and helpers to read a rendered container's flags by name."""
from __future__ import annotations

from functools import lru_cache

import pytest

from infra.render import Rendering, render

#: the Kubernetes version manifests are validated against (kubernetes-validate 1.37.0
#: ships schemas 1.25-1.37); the oldest release the stack supports.
K8S_VERSION = "1.31.0"


@lru_cache(maxsize=None)
def _render(stack: str, overrides: tuple[str, ...]) -> Rendering:
    return render(stack, overrides)


@pytest.fixture
def rendered():
    """``rendered(stack, *overrides)`` -> Rendering, cached per arguments (do not mutate)."""
    def get(stack: str = "dev", *overrides: str) -> Rendering:
        return _render(stack, tuple(overrides))
    return get


def flag(args: list[str], name: str) -> str:
    """The value after ``name`` in a container's ``args``; AssertionError if absent."""
    assert name in args, f"{name} not in {args}"
    return args[args.index(name) + 1]
