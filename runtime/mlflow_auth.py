"""The MLflow server's own basic-auth: the environment it reads its admin and CSRF secret from (``TRACKING_SERVER_ENV``), and its config file (``tracking_auth_config``).

``role_specs.tracking_server(basic_auth=True)`` runs ``mlflow server --app-name
basic-auth``; the stack (``components/tracking_server.py``) and the local server
(``runtime.local.mlflow_server``) give it this environment and file, filled from the
``tracking`` credential's keys (``runtime.auth``).
"""
from __future__ import annotations

from runtime.role_specs import TRACKING_PASSWORD, TRACKING_USERNAME

#: the ``tracking`` Secret's key the MLflow server alone reads: the static secret of its CSRF
#: protection (``MLFLOW_FLASK_SERVER_SECRET_KEY``, required by ``--app-name basic-auth``)
TRACKING_SERVER_SECRET = "server-secret-key"
#: the environment ``mlflow server --app-name basic-auth`` reads its admin and secret from,
#: with the key of the ``tracking`` Secret each comes from; and its config file's variable
TRACKING_SERVER_ENV = (("MLFLOW_AUTH_ADMIN_USERNAME", TRACKING_USERNAME), ("MLFLOW_AUTH_ADMIN_PASSWORD", TRACKING_PASSWORD),
                       ("MLFLOW_FLASK_SERVER_SECRET_KEY", TRACKING_SERVER_SECRET))
TRACKING_AUTH_CONFIG_ENV = "MLFLOW_AUTH_CONFIG_PATH"


def tracking_auth_config(users_db: str) -> str:
    """The MLflow server's basic-auth config file (``basic_auth.ini``, at
    ``TRACKING_AUTH_CONFIG_ENV``): logged-in users may read, its users in the SQLite file
    ``users_db``, a login checked once a minute per worker rather than a password hash per
    request (``auth_cache_ttl_seconds``)."""
    return ("[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{users_db}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 60\n")
