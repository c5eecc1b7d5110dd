"""Serving fixtures: two versions published by the trainer's own export, and a data plane
serving the first of them over a fake cube, behind the REST app."""
from __future__ import annotations

import numpy as np
import pytest
from werkzeug.test import Client

from runtime.formats import features
from runtime.serving.ctr_model import CtrModel
from runtime.serving.dataplane import DataPlane
from runtime.metrics.serving import ServingMetrics
from runtime.serving.model import VersionWatcher
from runtime.serving.rest import create_app
from tests.helpers import V1, V2, FakeCube, export_version, make_table, publish


def _rows(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        dense = [("" if rng.random() < 0.2 else str(int(rng.integers(0, 300)))) for _ in range(13)]
        cats = [("" if rng.random() < 0.1 else format(int(rng.integers(0, 40)), "x")) for _ in range(26)]
        out.append("\t".join([str(i % 2)] + dense + cats))
    return out


def ctr_plane(watcher: VersionWatcher, cube, **kw) -> DataPlane:
    """A data plane serving the CTR model over ``watcher`` and ``cube`` (one client for
    every thread); ``kw`` go to ``CtrModel``."""
    metrics = ServingMetrics()
    return DataPlane([CtrModel(watcher, lambda: cube, metrics=metrics, **kw)], metrics)


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    lines = _rows(64)
    b = features.parse_criteo_lines(lines)
    tables = {V1: make_table(b.feasigns, 1), V2: make_table(b.feasigns, 2)}
    dirs = {v: export_version(root, v, tables[v], seed=i) for i, v in enumerate((V1, V2), 1)}
    return {"root": root, "lines": lines, "batch": b, "tables": tables, "dirs": dirs}


@pytest.fixture
def served(env, tmp_path):
    """A data plane at version V1 (only V1 in the donefile) over a FakeCube holding V1 and
    V2, behind the REST app."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "versions").symlink_to(env["root"] / "versions")
    publish(root, V1)
    cube = FakeCube(dict(env["tables"]))
    watcher = VersionWatcher(str(root), None, tmp_path / "work", pool_size=4,
                             probe=lambda v: cube.seek(np.zeros(1, np.uint64), version=v))
    plane = ctr_plane(watcher, cube, max_batch=32)
    assert watcher.poll_once()
    return {"root": root, "cube": cube, "watcher": watcher, "plane": plane, "client": Client(create_app(plane))}


