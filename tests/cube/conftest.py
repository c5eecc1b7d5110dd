"""The cube tests' shared fixtures: ``cluster`` (tests/cube/transfer_harness.py's in-process
2 x 2 cube of fake servers and real agents; a test module may define its own ``cluster``)
and ``root`` (a version root with an empty donefile directory)."""
from __future__ import annotations

import pytest

from tests.cube.transfer_harness import Cluster


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "donefile").mkdir(parents=True)
    return r
