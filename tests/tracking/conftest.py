"""A real ``mlflow server`` on 127.0.0.1 for the tracking tests (runtime.local.mlflow_server),
with MLflow's basic auth (its login the session's ``tracking`` credential), started once per
session and stopped (by PID, with its process group) at the end. Each test that takes
``mlflow_server`` presents that login (this process and the jobs it starts:
``$ELASTIC_CTR_CREDENTIALS_DIR`` and ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``) for its
own duration only, so no later test inherits it."""
from __future__ import annotations

import pytest

from runtime import auth, proc, tracking_login
from runtime.local.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def _mlflow_session(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    creds = auth.write_credentials(root / "credentials")
    with proc.ProcessGroup(root / "logs") as group:
        yield MlflowServer(root / "store", group, credentials_dir=creds).start(), creds


@pytest.fixture
def mlflow_server(_mlflow_session, monkeypatch):
    server, creds = _mlflow_session
    for k, v in auth.env_for(creds).items():
        monkeypatch.setenv(k, v)
    for k in (tracking_login.USERNAME_ENV, tracking_login.PASSWORD_ENV):
        monkeypatch.setenv(k, "")  # recorded, so restored after the test; empty: login() sets it
    tracking_login.login(creds)
    return server
