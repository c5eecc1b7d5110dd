"""Locations on object stores and HDFS, through fsspec: ``s3://``, ``gs://``, ``hdfs://``,
``webhdfs://`` (and any other protocol fsspec knows).

``runtime.storage`` dispatches here for every location whose scheme is neither empty (a
local path) nor ``http``/``https`` (the file server and plain URLs, handled there as
before). The functions here raise the store's own exceptions; ``runtime.storage`` wraps
them into ``LocationError`` with ``describe(exc)``, so a caller sees one error type that
names the location.

What each store needs (a location whose package is missing fails naming what to install;
only ``s3`` is an extra of elastic-ctr, pinned and tested here against an S3-protocol
server; gcsfs's current releases pull protobuf 7, which Paddle 3.0 and Pulumi refuse, so
``gs://`` and ``hdfs://`` are reached through fsspec as is, untested here):

==============================  =======================  ==========================================
scheme                          install                  credentials
==============================  =======================  ==========================================
``s3://bucket/key``             ``elastic-ctr[s3]``      ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
                                (s3fs)                   or a web-identity token (IRSA); endpoint of
                                                         an S3-compatible store (MinIO, Ceph, OSS,
                                                         BOS) in ``AWS_ENDPOINT_URL_S3`` or
                                                         ``AWS_ENDPOINT_URL`` (botocore reads both)
``gs://bucket/key``             ``gcsfs``                ``GOOGLE_APPLICATION_CREDENTIALS`` or the
                                                         metadata server (GKE Workload Identity)
``hdfs://namenode:port/p``      ``pyarrow``              libhdfs and a JVM (``JAVA_HOME``,
                                                         ``CLASSPATH``); a Kerberos ticket if secured
``webhdfs://namenode:port/p``   nothing (fsspec)         the NameNode's HTTP port; user in the URL
==============================  =======================  ==========================================

S3 requests use bounded retries (botocore's ``standard`` mode, 4 attempts, 5 s connect
timeout), so an unreachable endpoint fails within seconds, naming the location.

The donefile append (``append_line``) on S3 is a conditional write: the object is read
with its ETag and written back with ``If-Match: <ETag>`` (``If-None-Match: *`` when it does
not exist yet); a concurrent or stale writer gets ``412 Precondition Failed`` and re-reads.
A line already present is not appended again, so a writer that restarts and repeats its
append neither loses nor duplicates a line. See docs/contracts.md.
"""
from __future__ import annotations

import os
import time
from typing import IO
from urllib.parse import urlparse

INSTALL = {"s3": "pip install 'elastic-ctr[s3]'", "s3a": "pip install 'elastic-ctr[s3]'",
           "gs": "pip install gcsfs", "gcs": "pip install gcsfs", "hdfs": "pip install pyarrow",
           "viewfs": "pip install pyarrow"}
"""scheme -> what installs its fsspec implementation (the ``s3`` extra, or the package)."""
LOCAL_SCHEMES = ("", "http", "https")
S3_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 4, "mode": "standard"}}
"""botocore settings for every S3 client (bounded retries of transient errors)."""
#: S3_CONFIG's figures, for messages: botocore rewrites the ``retries`` dict it is given, and
#: its ``max_attempts`` counts the retries after the first request
_CONNECT_S, _READ_S = S3_CONFIG["connect_timeout"], S3_CONFIG["read_timeout"]
_ATTEMPTS = S3_CONFIG["retries"]["max_attempts"] + 1
APPEND_ATTEMPTS = 8


class StoreError(OSError):
    """An object-store operation that cannot succeed as asked (a missing store package,
    a conditional append that kept losing its race)."""


def scheme(location: str) -> str:
    """The URL scheme of ``location`` (lower case; ``""`` for a local path)."""
    loc = str(location)
    if "://" not in loc:
        return ""
    return urlparse(loc).scheme.lower()


def is_store(location: str) -> bool:
    """True for a location handled through fsspec (``s3://``, ``gs://``, ``hdfs://``, ...)."""
    return scheme(location) not in LOCAL_SCHEMES


def _options(proto: str) -> dict:
    if proto in ("s3", "s3a"):
        # listings are never cached: a partition's _SUCCESS must be seen once it lands
        return {"use_listings_cache": False, "config_kwargs": dict(S3_CONFIG)}
    if proto in ("gs", "gcs"):
        return {"use_listings_cache": False}
    return {}


def filesystem(location: str):
    """``(fsspec filesystem, path inside it)`` for ``location``.

    Raises ``StoreError`` naming what to install when the store's package is
    missing, or when the store's native library cannot be loaded (``hdfs://`` without
    libhdfs: use ``webhdfs://``)."""
    import fsspec

    proto = scheme(location)
    try:
        return fsspec.core.url_to_fs(str(location), **_options(proto))
    except ImportError as exc:
        if proto in INSTALL:
            raise StoreError(f"{proto}:// needs its fsspec implementation: {INSTALL[proto]} ({exc})") from None
        raise StoreError(f"{proto}:// has no fsspec implementation installed ({exc})") from None
    except ValueError as exc:
        raise StoreError(f"{proto}:// is not a protocol fsspec knows ({exc})") from None
    except OSError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreError(f"{proto}:// cannot be opened here: {first} (hdfs:// needs libhdfs and a JVM; "
                         f"webhdfs:// needs neither)") from None


def describe(exc: BaseException, location: str = "") -> str:
    """A one-line reason for a store error: what was wrong, for a message that already
    names the location: access denied (with where the credentials came from, for an
    ``s3://`` ``location``: ``credential_source``, never a secret), no credentials, the
    endpoint unreachable, a timeout, a missing object or bucket."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    s3 = scheme(location) in ("s3", "s3a")
    if isinstance(exc, StoreError):
        return text
    if isinstance(exc, FileNotFoundError):
        return f"no such object or bucket ({text})"
    if isinstance(exc, PermissionError):
        used = f"; credentials: {credential_source()}" if s3 else ""
        return f"access denied: check the credentials ({text}{used})"
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return f"no credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a workload identity ({text})"
    if name in ("ConnectTimeoutError", "ReadTimeoutError") or isinstance(exc, TimeoutError):
        limits = f" (connect {_CONNECT_S} s, read {_READ_S} s, {_ATTEMPTS} attempts)" if s3 else ""
        return f"timed out{limits}: {text}"
    if name in ("EndpointConnectionError", "ClientConnectorError", "ConnectionError"):
        tries = f" after {_ATTEMPTS} attempts" if s3 else " after retries"
        return f"endpoint unreachable{tries} ({text})"
    return f"{name}: {text}"


#: botocore's name of each credential provider -> what an operator knows it as
CREDENTIAL_SOURCES = {
    "env": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from the environment",
    "explicit": "keys given to the client",
    "shared-credentials-file": "the shared credentials file (~/.aws/credentials or $AWS_SHARED_CREDENTIALS_FILE)",
    "config-file": "the config file (~/.aws/config or $AWS_CONFIG_FILE)",
    "assume-role": "a role assumed from the config file's profile",
    "assume-role-with-web-identity": "a web identity token ($AWS_WEB_IDENTITY_TOKEN_FILE: IRSA)",
    "container-role": "the container credentials endpoint (EKS Pod Identity, ECS task role)",
    "iam-role": "the instance's IAM role (instance metadata)",
    "sso": "AWS IAM Identity Center (SSO)",
    "custom-process": "a credential_process of the config file",
}


def credential_source() -> str:
    """Which of botocore's credential providers the S3 client's keys come from (the chain
    s3fs resolves: environment, shared files, web identity, container, instance metadata),
    with the access key id's last 4 characters; never a secret. ``"none found"`` when the
    chain finds none."""
    try:
        import botocore.session

        creds = botocore.session.get_session().get_credentials()
    except Exception as exc:  # noqa: BLE001 - a broken config file: say so, do not fail the message
        return f"unknown ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if creds is None:
        return "none found (environment, ~/.aws, web identity, container, instance metadata)"
    key = getattr(creds, "access_key", "") or ""
    where = CREDENTIAL_SOURCES.get(creds.method, creds.method)
    return f"{where}, key id ...{key[-4:]}" if len(key) >= 8 else where


def _full(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def info(location: str) -> dict | None:
    """The store's metadata of the object ``location`` (``size``, ``type``, ``ETag`` on S3),
    or None when it does not exist."""
    fs, path = filesystem(location)
    try:
        return fs.info(path)
    except FileNotFoundError:
        return None


def exists(location: str) -> bool:
    """True if the object (a file, not a prefix) ``location`` exists."""
    got = info(location)
    return bool(got) and got.get("type") != "directory"


def list_dir(location: str) -> list[tuple[str, str]]:
    """Sorted ``[(name, "file" | "dir")]`` directly under the prefix ``location``.
    Raises ``FileNotFoundError`` when nothing is under it."""
    fs, path = filesystem(location)
    entries = fs.ls(path.rstrip("/"), detail=True)
    out = []
    for e in entries:
        name = e["name"].rstrip("/").rsplit("/", 1)[-1]
        if name:
            out.append((name, "dir" if e.get("type") == "directory" else "file"))
    return sorted(set(out))


def expand(pattern: str) -> list[str]:
    """A location, prefix or glob -> the sorted full locations of the matching objects;
    a prefix expands to the objects directly under it."""
    fs, path = filesystem(pattern)
    if any(c in path for c in "*?["):
        names = [p for p in fs.glob(path) if fs.isfile(p)]
    else:
        got = fs.info(path) if fs.exists(path) else None
        if got is None:
            return []
        if got.get("type") == "directory":
            names = [e["name"] for e in fs.ls(path.rstrip("/"), detail=True) if e.get("type") == "file"]
        else:
            names = [path]
    return sorted(_full(fs, p) for p in names)


def open_read(location: str) -> IO[bytes]:
    """``location`` opened for streamed binary reading (read ahead in blocks)."""
    fs, path = filesystem(location)
    return fs.open(path, "rb")


def read_bytes(location: str) -> bytes:
    """The whole content of the object ``location``."""
    fs, path = filesystem(location)
    return fs.cat_file(path)


def put_file(local: str | os.PathLike, location: str) -> None:
    """Uploads a local file to ``location``. An object store publishes an object whole or
    not at all (one PUT, or a multipart upload completed last), so a reader never sees a
    half-written object; s3fs/botocore send a request checksum the store verifies."""
    fs, path = filesystem(location)
    fs.put_file(str(local), path)


def append_line(location: str, line: str) -> None:
    """Appends ``line`` (no newline) to the text object ``location``, exactly once.

    S3: conditional writes (``If-Match`` with the ETag read / ``If-None-Match: *``), retried
    after a 412 up to ``APPEND_ATTEMPTS`` times; other stores: read-modify-write (one
    writer). A line already present in the object is not appended again. Raises
    ``StoreError`` when the race is lost every time."""
    fs, path = filesystem(location)
    line = line.rstrip("\n")
    conditional = scheme(location) in ("s3", "s3a")
    for attempt in range(APPEND_ATTEMPTS):
        try:
            meta = fs.info(path)
            old = fs.cat_file(path)
        except FileNotFoundError:
            meta, old = None, b""
        if line.encode() in old.splitlines():
            return
        if old and not old.endswith(b"\n"):
            old += b"\n"
        data = old + line.encode() + b"\n"
        if not conditional:
            fs.pipe_file(path, data)
            return
        cond = {"IfMatch": meta["ETag"]} if meta else {"IfNoneMatch": "*"}
        try:
            fs.pipe_file(path, data, **cond)
            return
        except (FileExistsError, OSError) as exc:
            if not _precondition_failed(exc):
                raise
        time.sleep(min(0.05 * 2 ** attempt, 1.0))
    raise StoreError(f"append lost the race {APPEND_ATTEMPTS} times (another writer keeps changing it)")


def _precondition_failed(exc: BaseException) -> bool:
    return isinstance(exc, FileExistsError) or "pre-condition" in str(exc).lower() or "412" in str(exc)
