"""A real ``mlflow server`` on 127.0.0.1 for the tracking tests (runtime.local.mlflow_server),
started once per session and stopped (by PID, with its process group) at the end."""
from __future__ import annotations

import pytest

from runtime import proc
from runtime.local.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    with proc.ProcessGroup(root / "logs") as group:
        yield MlflowServer(root / "store", group).start()
