"""Shared pytest fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    """``../shared`` beside the checkout; tests that need it skip where it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (real sample rows and Volcano schemas live there)")
    return SHARED
