"""Shared pytest fixtures, and how ``make test`` spreads the tests (scripts/run-tests.sh)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TESTS = Path(__file__).resolve().parent

#: test directories whose tests run in the serial phase, alone on the machine: the
#: containers (one engine, whole-stack runs), the end-to-end pipelines and the SIGTERM
#: drains, which another worker's load would slow past what they measure or wait for
SERIAL_DIRS = frozenset({"containers", "e2e", "lifecycle"})
#: directory -> xdist group: its tests run on one worker, one after another (a session
#: server they share, or CPU-heavy parameter-server jobs that must not overlap each other)
GROUPS = {"tracking": "mlflow", "trainer": "paddle-ps"}
#: single test files run in the serial phase: they measure timing (overload answered at
#: once, slow clients taking nothing from others) or need the whole machine (a live
#: Prometheus scraping a whole pipeline)
SERIAL_FILES = frozenset({"monitoring/test_live.py", "serving/test_overload.py", "common/test_slow_clients.py"})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Marks ``serial`` the tests of ``SERIAL_DIRS`` and ``SERIAL_FILES`` and those marked
    ``containers``; puts the tests of a ``GROUPS`` directory in its xdist group, and every
    other test in its file's group (unless it names one): a file's tests run on one worker,
    in order, so a module-scoped fixture (a cluster several tests walk through) starts once."""
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(TESTS)
        except ValueError:  # a test outside tests/
            continue
        top = rel.parts[0]
        if top in SERIAL_DIRS or rel.as_posix() in SERIAL_FILES or item.get_closest_marker("containers"):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(GROUPS.get(top, rel.as_posix())))


@pytest.fixture
def shared_dir() -> Path:
    """``../shared`` beside the checkout; tests that need it skip where it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (real sample rows and Volcano schemas live there)")
    return SHARED


def clear_store_clients() -> None:
    """Drops the object-store clients this process cached (fsspec's configuration, s3fs's
    filesystem instances: an instance keeps the endpoint and keys it was made with, whatever
    the environment says later)."""
    import sys

    if "fsspec" in sys.modules:
        sys.modules["fsspec"].config.conf.clear()
    if "s3fs" in sys.modules:
        sys.modules["s3fs"].S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def _fresh_store_clients():
    """Every test ends with no object-store client cached, so the next test (or module
    fixture) reaches the endpoint its own environment names, whatever ran before it."""
    yield
    clear_store_clients()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One moto S3 server on loopback for the session (tests/s3server.py), stopped by PID."""
    from tests.s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3server")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket on the session's S3 server, with this process's AWS_* environment
    pointing at it; returns ``s3://<bucket>``."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    clear_store_clients()
    return f"s3://{s3_server.new_bucket()}"
