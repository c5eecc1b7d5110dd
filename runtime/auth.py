"""Credentials per trust boundary (``runtime.role_specs``: ``CUBE_CONTROL``,
``FILES_WRITE``, ``FILES_READ``, ``TRACKING``): where a role reads them, how a server
checks one and how a client presents one. docs/security.md ("Credentials", "Control
endpoints", "Rotation") is the user's side of this module.

Files: ``<dir>/<boundary>/current`` and, while a rotation rolls out,
``<dir>/<boundary>/previous`` (``<dir>``: ``$ELASTIC_CTR_CREDENTIALS_DIR``, default
``/var/run/secrets/elastic-ctr``, where a pod mounts one Secret per boundary). Each
holds one credential as text (surrounding white space ignored). A server accepts
``current`` and ``previous``; a client presents ``current``. Every check stats the files
(two ``stat`` calls, no read while they are unchanged) and re-reads one whose inode,
size or modification time changed, so a rotation (a Secret's new contents swapped in
by the kubelet, a file rewritten) takes effect without a restart.

Wire format: ``Authorization: Bearer <credential>`` (RFC 6750). A request that needs a
credential and lacks it, or sends another, is answered ``401`` with
``WWW-Authenticate: Bearer realm="elastic-ctr"`` and the JSON ``{"error": "..."}``
naming the boundary and what is missing or wrong (never a credential), and counted in
``elastic_ctr_auth_refusals_total{role,endpoint,reason}`` (``runtime.metrics.auth``).
Comparisons are constant-time (``hmac.compare_digest``) against every accepted value.
No credential is ever logged.
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

from runtime import mlflow_auth, role_specs

log = logging.getLogger(__name__)

CURRENT, PREVIOUS = "current", "previous"
#: why a request was refused (the ``reason`` label of the refusals counter)
MISSING, MALFORMED, WRONG, UNCONFIGURED = "missing", "malformed", "wrong", "unconfigured"
#: the help text of every control role's ``--insecure-no-auth``
INSECURE_HELP = ("serve without checking credentials (state-changing endpoints open to anyone who reaches "
                 "the port; for a test on a machine of one's own only)")


class CredentialError(RuntimeError):
    """A credential a role needs is not configured; the message names the file (never a
    credential's value) and the way out."""


def credentials_dir(directory: str | os.PathLike | None = None) -> Path:
    """``directory``, else ``$ELASTIC_CTR_CREDENTIALS_DIR``, else
    ``role_specs.CREDENTIALS_DIR``."""
    return Path(directory or os.environ.get(role_specs.CREDENTIALS_DIR_ENV) or role_specs.CREDENTIALS_DIR)


class Credential:
    """The credential of one trust boundary, read from ``<dir>/<boundary>/{current,previous}``
    (module docstring) and re-read when a file changes. Thread-safe (a stale cache entry
    costs one extra read)."""

    def __init__(self, boundary: str, directory: str | os.PathLike | None = None):
        if boundary not in role_specs.CREDENTIAL_BOUNDARIES:
            raise ValueError(f"boundary {boundary!r} is not one of {role_specs.CREDENTIAL_BOUNDARIES}")
        self.boundary = boundary
        self.dir = credentials_dir(directory) / boundary
        self._cache: dict[str, tuple[tuple, Optional[bytes]]] = {}

    def _read(self, name: str) -> Optional[bytes]:
        path = self.dir / name
        try:
            st = os.stat(path)
        except OSError:
            self._cache.pop(name, None)
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            value = path.read_bytes().strip() or None
        except OSError:
            return None
        self._cache[name] = (key, value)
        return value

    def current(self) -> Optional[str]:
        """The credential a client presents (``current``), None when the file is missing or empty."""
        v = self._read(CURRENT)
        return v.decode("utf-8", "replace") if v is not None else None

    def accepted(self) -> list[bytes]:
        """What a server accepts now: ``current``, and ``previous`` when present."""
        return [v for v in (self._read(CURRENT), self._read(PREVIOUS)) if v is not None]

    def require(self, role: str) -> "Credential":
        """Returns self when ``current`` exists; raises ``CredentialError`` naming the file
        and ``--insecure-no-auth`` otherwise (a role's start-up check)."""
        if self._read(CURRENT) is None:
            raise CredentialError(
                f"{role}: no {self.boundary} credential at {self.dir / CURRENT} (set {role_specs.CREDENTIALS_DIR_ENV} "
                f"to the directory holding <boundary>/current, or start with --insecure-no-auth)")
        return self

    def headers(self) -> dict[str, str]:
        """``{"Authorization": "Bearer <current>"}``, or ``{}`` when none is configured."""
        cur = self.current()
        return {"Authorization": f"Bearer {cur}"} if cur else {}


class FixedCredential:
    """A credential given as a value (a flag's file read once, an environment variable):
    the ``Credential`` interface without files, so no rotation without a restart."""

    def __init__(self, boundary: str, value: str):
        self.boundary, self._value = boundary, value.strip().encode()

    def current(self) -> Optional[str]:
        return self._value.decode()

    def accepted(self) -> list[bytes]:
        return [self._value] if self._value else []

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._value.decode()}"} if self._value else {}


def check(credentials: Sequence[Credential], authorization: Optional[str]) -> Optional[str]:
    """Checks an ``Authorization`` header value against every value ``credentials`` accept.
    Returns None when one matches, else the reason: ``UNCONFIGURED`` (nothing accepted:
    the server has no credential), ``MISSING``, ``MALFORMED`` (not ``Bearer <value>``) or
    ``WRONG``. Every accepted value is compared (``hmac.compare_digest``), whichever matches."""
    accepted = [a for c in credentials for a in c.accepted()]
    if not accepted:
        return UNCONFIGURED
    if not authorization:
        return MISSING
    scheme, _, given = authorization.strip().partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        return MALFORMED
    sent = given.encode("utf-8", "replace")
    ok = False
    for a in accepted:
        ok |= hmac.compare_digest(sent, a)
    return None if ok else WRONG


def refusal_message(reason: str, boundaries: Iterable[str]) -> str:
    """The ``error`` of a 401 for ``reason``, naming the boundaries (never a credential)."""
    names = " or ".join(boundaries)
    return {
        MISSING: f"Authorization: 'Bearer <credential>' of {names} is required, none was sent",
        MALFORMED: f"Authorization: expected 'Bearer <credential>' of {names}",
        WRONG: f"Authorization: the credential sent is not the current (or previous) one of {names}",
        UNCONFIGURED: f"this server has no {names} credential configured: every such request is refused",
    }[reason]


class Guard:
    """Checks the requests of a Flask app (``install``): a request for which
    ``needs(method, path)`` returns credentials is refused ``401`` (module docstring)
    unless it presents one they accept. ``role`` and the route's rule are the counter's
    labels (``runtime.metrics.auth.AuthMetrics``; ``metrics`` None: not counted)."""

    def __init__(self, role: str, needs: Callable[[str, str], Sequence[Credential]], metrics=None):
        self.role, self.needs, self.metrics = role, needs, metrics

    def install(self, app):
        """Registers the check as ``app``'s first ``before_request``; returns ``app``."""
        from flask import jsonify, request

        def before():
            creds = self.needs(request.method, request.path)
            if not creds:
                return None
            reason = check(creds, request.headers.get("Authorization"))
            if reason is None:
                return None
            endpoint = request.url_rule.rule if request.url_rule is not None else "other"
            if self.metrics is not None:
                self.metrics.refused(self.role, endpoint, reason)
            names = [c.boundary for c in creds]
            log.warning("%s: refused %s %s from %s: credential %s (%s)", self.role, request.method, request.path,
                        request.remote_addr, reason, "/".join(names))
            resp = jsonify(error=f"{request.method} {request.path}: {refusal_message(reason, names)}")
            resp.status_code = 401
            resp.headers["WWW-Authenticate"] = 'Bearer realm="elastic-ctr"'
            return resp

        app.before_request_funcs.setdefault(None, []).insert(0, before)
        return app


def mutating(credential: Credential) -> Callable[[str, str], Sequence[Credential]]:
    """``needs`` for a control role: every request but ``GET``/``HEAD``/``OPTIONS`` needs
    ``credential`` (reads, ``/metrics`` and the probes stay open)."""
    def needs(method: str, _path: str) -> Sequence[Credential]:
        return () if method in ("GET", "HEAD", "OPTIONS") else (credential,)
    return needs


def control_guard(role: str, insecure: bool, metrics=None, directory=None) -> Optional[Guard]:
    """The ``Guard`` of a cube control role (server or agent: ``CUBE_CONTROL`` on every
    state-changing request), None with ``insecure`` (``--insecure-no-auth``, logged).
    Raises ``CredentialError`` when the credential is not configured."""
    if insecure:
        log.warning("%s: --insecure-no-auth: state-changing endpoints are open to anyone who reaches the port", role)
        return None
    cred = Credential(role_specs.CUBE_CONTROL, directory).require(role)
    return Guard(role, mutating(cred), metrics)


def control_client(role: str, insecure: bool, directory=None) -> Optional[Credential]:
    """The ``CUBE_CONTROL`` credential a client role presents (transfer, agent), None with
    ``insecure``. Raises ``CredentialError`` when it is not configured."""
    if insecure:
        return None
    return Credential(role_specs.CUBE_CONTROL, directory).require(role)


def write_credentials(directory: str | os.PathLike, boundaries: Iterable[str] = role_specs.CREDENTIAL_BOUNDARIES,
                      values: Optional[Mapping[str, str]] = None) -> Path:
    """Writes a fresh credential (``secrets.token_urlsafe(32)``, or ``values[boundary]``)
    to ``<directory>/<boundary>/current`` for each boundary that has none yet (a
    boundary already written is kept: every launcher of one run may call this), files
    mode 0600 and directories 0700 (a local run's credentials: ``elastic-ctr local``, the
    local cube cluster, the local MLflow server, tests). For ``TRACKING`` the files are
    ``username``, ``password`` and ``server-secret-key`` (``role_specs.TRACKING_USERNAME``,
    ``TRACKING_PASSWORD``, ``TRACKING_SERVER_SECRET``). Returns ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for b in boundaries:
        d = directory / b
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o700)
        if (d / CURRENT).exists() or (d / role_specs.TRACKING_PASSWORD).exists():
            continue
        value = (values or {}).get(b) or secrets.token_urlsafe(32)
        files = {CURRENT: value}
        if b == role_specs.TRACKING:
            files = {role_specs.TRACKING_USERNAME: "elastic-ctr", role_specs.TRACKING_PASSWORD: value,
                     mlflow_auth.TRACKING_SERVER_SECRET: secrets.token_urlsafe(32)}
        for name, text in files.items():
            _write_private(d / name, text)
    return directory


def rotate(directory: str | os.PathLike, boundary: str, new_value: Optional[str] = None) -> str:
    """Step 1 of a rotation on local files: ``current`` becomes ``previous`` and a new
    ``current`` is written (mode 0600). Returns the new value. Step 3 (once every client
    presents the new one) is ``retire_previous``."""
    d = Path(directory) / boundary
    value = new_value or secrets.token_urlsafe(32)
    old = (d / CURRENT).read_text()
    _write_private(d / PREVIOUS, old)
    _write_private(d / CURRENT, value)
    return value


def retire_previous(directory: str | os.PathLike, boundary: str) -> None:
    """Step 3 of a rotation: removes ``previous`` (it is refused from then on)."""
    try:
        (Path(directory) / boundary / PREVIOUS).unlink()
    except FileNotFoundError:
        pass


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def env_for(directory: str | os.PathLike) -> dict[str, str]:
    """The environment entry that points a role at ``directory``'s credentials."""
    return {role_specs.CREDENTIALS_DIR_ENV: str(directory)}
