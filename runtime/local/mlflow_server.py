"""A real ``mlflow server`` on 127.0.0.1 for ``elastic-ctr local`` (the demo) and the tests:
backend store ``sqlite:///<root>/mlflow.db``, artifacts served by the server from
``<root>/artifacts`` (``--serve-artifacts``), so clients need only HTTP (``mlflow-skinny``).

With ``credentials_dir`` (a run's credentials, ``runtime.auth.write_credentials``) the
server runs MLflow's own authentication (``--app-name basic-auth``, as
``runtime.role_specs.tracking_server(basic_auth=True)``): its admin is the ``tracking``
credential's user (``<dir>/tracking/username``, ``password``), its CSRF secret
``<dir>/tracking/server-secret-key``, its user store ``<root>/basic_auth.db``
(``<root>/basic_auth.ini``); every request but ``/health`` needs that login, which the
pipeline's clients send (``runtime.tracking_login``).

Needs the full ``mlflow`` distribution (the ``tracking-server`` extra). The server runs
as a role of a ``runtime.proc.ProcessGroup`` (its own process group, stopped by PID with
the group: SIGTERM, then SIGKILL after the group's grace period).

Page addresses of the MLflow UI (a JavaScript app): ``run_url`` (the run's overview) and
``metrics_url`` (the run's metric charts), as MLflow 3's UI routes them.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import requests

from runtime.role_specs import TRACKING_HEALTH

START_TIMEOUT_S = 120.0  # measured: /health answers after ~21 s on a cold 2-core machine


class MlflowServerError(RuntimeError):
    """The server could not be started (the message says why and where its log is)."""


def available() -> bool:
    """True when the full ``mlflow`` (with its server) is installed in this interpreter."""
    try:
        import mlflow.server  # noqa: F401
    except ImportError:
        return False
    return True


class MlflowServer:
    """One ``mlflow server`` process.

    Args:
        root: directory of the backend store (``mlflow.db``) and ``artifacts/``; created.
        group: the ``runtime.proc.ProcessGroup`` that starts and stops it.
        port: TCP port on 127.0.0.1 (0: a free one).
        name: the role's name in the group (its log: ``<group.log_dir>/<name>.log``).
        credentials_dir: the run's credentials: basic auth on (module docstring); None: off.
    """

    def __init__(self, root: str | Path, group, port: int = 0, name: str = "mlflow-server",
                 credentials_dir: str | Path | None = None):
        from runtime import proc

        self.root = Path(root)
        self.group = group
        self.port = port or proc.free_ports(1)[0]
        self.name = name
        self.url = f"http://127.0.0.1:{self.port}"
        self.role = None
        self.credentials_dir = Path(credentials_dir) if credentials_dir else None

    def login(self) -> tuple[str, str] | None:
        """The ``(username, password)`` the server's clients log in with (None: no auth)."""
        from runtime import tracking_login

        return tracking_login.read(self.credentials_dir) if self.credentials_dir else None

    def _auth_env(self) -> dict[str, str]:
        """The basic-auth app's environment (its config file written first, mode 0600)."""
        from runtime import mlflow_auth, role_specs

        d = self.credentials_dir / role_specs.TRACKING
        ini = self.root / "basic_auth.ini"
        fd = os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(mlflow_auth.tracking_auth_config(str((self.root / "basic_auth.db").resolve())))
        env = {mlflow_auth.TRACKING_AUTH_CONFIG_ENV: str(ini.resolve())}
        for var, key in mlflow_auth.TRACKING_SERVER_ENV:
            env[var] = (d / key).read_text().strip()
        return env
    def argv(self) -> list[str]:
        """The server's command line (``runtime.role_specs.tracking_server``)."""
        from runtime import role_specs

        return role_specs.mlflow_argv(role_specs.tracking_server(
            role_specs.LOOPBACK, self.port, basic_auth=bool(self.credentials_dir),
            backend_store_uri=f"sqlite:///{self.root.resolve() / 'mlflow.db'}",
            artifacts_destination=str((self.root / "artifacts").resolve())))

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "MlflowServer":
        """Starts the server and waits until ``/health`` answers 200 (``launch`` +
        ``wait_ready``). Raises ``MlflowServerError``."""
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "MlflowServer":
        """Starts the process without waiting (``wait_ready`` waits). Raises
        ``MlflowServerError`` when mlflow's server is not installed."""
        if not available():
            raise MlflowServerError("the full mlflow package is not installed (pip install "
                                    "'elastic-ctr[tracking-server]'); mlflow-skinny has no server")
        self.root.mkdir(parents=True, exist_ok=True)
        # no background job runner (MLflow's GenAI jobs, unused here): its consumers would
        # outlive the server process
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        if self.credentials_dir:
            env.update(self._auth_env())
        self.role = self.group.start(self.name, self.argv(), env=env)
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> "MlflowServer":
        """Waits until ``/health`` answers 200. Raises ``MlflowServerError`` when the
        process exits or ``timeout_s`` passes (the message holds the log's tail)."""
        from runtime import proc

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.role.proc.poll()
            if rc is not None:
                raise MlflowServerError(f"mlflow server exited with code {rc}; log {self.role.log_path}:\n"
                                        + proc.tail(self.role.log_path))
            try:
                if requests.get(self.url + TRACKING_HEALTH, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise MlflowServerError(f"mlflow server at {self.url} did not answer /health within {timeout_s:.0f} s; "
                                f"log {self.role.log_path}:\n" + proc.tail(self.role.log_path))

    def stop(self) -> None:
        """Stops the server (SIGTERM to its process group, SIGKILL after the grace period)."""
        if self.role is not None:
            self.group.stop(self.role)

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the UI."""
        return f"{self.url}/#/experiments/{experiment_id}/runs/{run_id}"

    def metrics_url(self, experiment_id: str, run_id: str) -> str:
        """The run's metric charts in the UI."""
        return self.run_url(experiment_id, run_id) + "/model-metrics"


