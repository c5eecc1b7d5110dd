"""An S3-protocol server on loopback for the tests and benchmarks: moto's server mode
(``python -m moto.server``, what s3fs's own test suite runs against), started as a child
process on a free port of 127.0.0.1 and stopped by its PID.

moto accepts any key pair and enforces conditional writes (``If-Match`` /
``If-None-Match``). ``env()`` gives the standard variables a client reads: botocore takes
the endpoint from ``AWS_ENDPOINT_URL_S3``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from runtime.proc import free_port, tail, wait_for_port


class S3Server:
    """``with S3Server() as s3:`` -> ``s3.endpoint`` (``http://127.0.0.1:<port>``),
    ``s3.env()``, ``s3.new_bucket()``. The server's log is kept in a temporary file and
    its tail is raised with a start failure."""

    def __init__(self, log_dir: str | os.PathLike | None = None, server_env: dict[str, str] | None = None,
                 host: str = "127.0.0.1"):
        self.host = host
        self.port = free_port(host)
        self.endpoint = f"http://{host}:{self.port}"
        self.log = Path(log_dir or tempfile.mkdtemp(prefix="s3server-")) / "moto.log"
        self.proc: subprocess.Popen | None = None
        #: extra environment of the server, e.g. ``INITIAL_NO_AUTH_ACTION_COUNT`` (moto checks
        #: signatures and IAM keys after that many requests)
        self.server_env = dict(server_env or {})

    def env(self) -> dict[str, str]:
        """The environment a client of this server needs (any key pair is accepted)."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self) -> "S3Server":
        out = open(self.log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **self.server_env})
        out.close()
        try:
            wait_for_port(self.host, self.port, timeout_s=60, proc=self.proc, name="moto server", log_path=self.log)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"moto server did not start: {exc}\n{tail(self.log)}") from exc
        return self

    def new_bucket(self, prefix: str = "ctr") -> str:
        """Creates a fresh bucket and returns its name."""
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s, to the server's PID."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
