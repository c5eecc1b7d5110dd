"""Prometheus and promtool for the monitoring tests: Debian's ``prometheus`` package, which
``make install`` installs (scripts/install-prometheus.sh); a machine without it gets it
from the same script here, and a test fails (never skips) when it cannot."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        r = subprocess.run(["bash", str(REPO / "scripts" / "install-prometheus.sh")], capture_output=True, text=True)
        path = shutil.which(name)
        if path is None:
            pytest.fail(f"{name} is not installed and scripts/install-prometheus.sh failed:\n{r.stdout[-2000:]}"
                        f"\n{r.stderr[-2000:]}")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """The ``promtool`` binary."""
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The ``prometheus`` binary."""
    return _binary("prometheus")
