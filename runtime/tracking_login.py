"""MLflow login of the pipeline's clients (the trainer, the transfer, the demo): the
``tracking`` credential (``$ELASTIC_CTR_CREDENTIALS_DIR/tracking/username`` and
``.../password``, ``runtime.role_specs.TRACKING_USERNAME`` / ``TRACKING_PASSWORD``) set
as ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` in this process, which
MLflow's REST client sends as HTTP basic auth on every request (the server runs
``mlflow server --app-name basic-auth``: ``runtime.local.mlflow_server``, the tracking
pod). Variables already set by the user are left alone; with no credential files nothing
is set (a server without auth).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from runtime import role_specs
from runtime.auth import credentials_dir

USERNAME_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"


def read(directory: str | os.PathLike | None = None) -> Optional[tuple[str, str]]:
    """``(username, password)`` from the ``tracking`` credential files, None when either
    is missing or empty."""
    d = Path(credentials_dir(directory)) / role_specs.TRACKING
    try:
        user = (d / role_specs.TRACKING_USERNAME).read_text().strip()
        password = (d / role_specs.TRACKING_PASSWORD).read_text().strip()
    except OSError:
        return None
    return (user, password) if user and password else None


def login(directory: str | os.PathLike | None = None) -> bool:
    """Sets ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` from the credential files unless the
    user set them; returns whether credentials are in the environment now."""
    if os.environ.get(USERNAME_ENV) and os.environ.get(PASSWORD_ENV):
        return True
    creds = read(directory)
    if creds is None:
        return False
    os.environ[USERNAME_ENV], os.environ[PASSWORD_ENV] = creds
    return True
