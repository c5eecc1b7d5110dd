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
    import fsspec

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    fsspec.config.conf.clear()
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()
    return f"s3://{s3_server.new_bucket()}"
