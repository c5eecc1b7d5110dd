"""Fixtures for the Pulumi program's tests: cached offline renderings (mocks, in-process)."""
from __future__ import annotations

from functools import lru_cache

import pytest

from infra.render import Rendering, render

@lru_cache(maxsize=None)
def _render(stack: str, overrides: tuple[str, ...]) -> Rendering:
    return render(stack, overrides)


@pytest.fixture
def rendered():
    """``rendered(stack, *overrides)`` -> Rendering, cached per arguments (do not mutate)."""
    def get(stack: str = "dev", *overrides: str) -> Rendering:
        return _render(stack, tuple(overrides))
    return get
