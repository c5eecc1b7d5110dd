"""A real ``mlflow server`` on 127.0.0.1 for the tracking tests (runtime.local.mlflow_server),
with MLflow's basic auth (its login the session's ``tracking`` credential, which this
process and the jobs it starts present: ``$ELASTIC_CTR_CREDENTIALS_DIR`` and
``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` set for the session), started once per session
and stopped (by PID, with its process group) at the end."""
from __future__ import annotations

import os

import pytest

from tests.helpers import restore_environ

from runtime import auth, proc, tracking_login
from runtime.local.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    creds = auth.write_credentials(root / "credentials")
    names = (*auth.env_for(creds), tracking_login.USERNAME_ENV, tracking_login.PASSWORD_ENV)
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(auth.env_for(creds))
    for k in (tracking_login.USERNAME_ENV, tracking_login.PASSWORD_ENV):
        os.environ.pop(k, None)
    tracking_login.login(creds)
    try:
        with proc.ProcessGroup(root / "logs") as group:
            yield MlflowServer(root / "store", group, credentials_dir=creds).start()
    finally:
        restore_environ(saved)
