"""Prometheus and promtool for the monitoring tests: Debian's ``prometheus`` package, which
``make install`` installs where it can (root or sudo: scripts/install-prometheus.sh); without
it the tests that need it skip, naming it (they fail under ``make test``: tests/tools.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import tools

REPO = Path(__file__).resolve().parents[2]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        tools.need([f"/usr/bin/{name}"], "Prometheus", "make prometheus (apt-get: needs root or sudo)")
    return path or f"/usr/bin/{name}"


@pytest.fixture(scope="session")
def promtool() -> str:
    """The ``promtool`` binary."""
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The ``prometheus`` binary."""
    return _binary("prometheus")
