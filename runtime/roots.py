"""The check that a data or model root can be used, made before any process starts: a
root that does not exist (a missing bucket, a file server that is not there) or cannot
be written fails at once with a clear error, not an hour of training later at the first
export.

Location kinds (``runtime.storage``): a local path, an HTTP(S) URL (the file server), an
object-store location (``s3://bucket/prefix``; ``gs://``... through fsspec).
"""
from __future__ import annotations

import os
import tempfile
import uuid

import requests

from runtime import objectstore, storage

#: the object a write check puts at a root (a dot-name: listings and readers skip it)
PROBE = ".elastic-ctr-root-check"


def check_root(location: str, flag: str, write: bool = False, token: str | None = None,
               timeout_s: float = 10.0) -> None:
    """Checks that the root ``location`` (given as ``flag``, named in the error) is
    reachable and, with ``write``, that a file can be written there: a local directory
    is created if missing and a temporary file made and removed in it; a URL is listed
    (read) or a small ``PROBE`` file PUT with ``token`` (write); on an object store the
    bucket must exist (read) or a ``PROBE`` object is written and deleted (write).

    Raises ``storage.LocationError`` (``LocationNotFound`` for a missing directory or
    bucket) naming ``flag``, the location and what is wrong; on an object store: the
    bucket is missing, access is denied (naming where the credentials came from,
    ``objectstore.credential_source``), the endpoint is unreachable, or it timed out."""
    loc = str(location)
    if storage.is_store(loc):
        _check_store(loc, flag, write)
    elif storage.is_url(loc):
        _check_url(loc, flag, write, token, timeout_s)
    else:
        _check_path(loc, flag, write)


def _check_path(loc: str, flag: str, write: bool) -> None:
    if not write:
        if not os.path.isdir(loc):
            raise storage.LocationNotFound(f"{flag} {loc}: no such directory")
        return
    try:
        os.makedirs(loc, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=PROBE, dir=loc)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise storage.LocationError(f"{flag} {loc}: cannot write in it ({exc})") from None


def _check_url(loc: str, flag: str, write: bool, token: str | None, timeout_s: float) -> None:
    if write:
        url = storage.join(loc.rstrip("/") + "/", PROBE)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            r = storage.session().put(url, data=b"ok\n", headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise storage.LocationError(f"{flag} {loc}: unreachable ({type(exc).__name__}: {exc})") from None
        if r.status_code >= 300:
            hint = " (check the upload token)" if r.status_code in (401, 403) else ""
            raise storage.LocationError(f"{flag} {loc}: cannot write in it: HTTP {r.status_code}{hint}")
        return
    try:
        storage.list_dir(loc, timeout_s)
    except storage.LocationError as exc:
        raise type(exc)(f"{flag} {loc}: {exc}") from None


def _check_store(loc: str, flag: str, write: bool) -> None:
    try:
        fs, path = objectstore.filesystem(loc)
    except objectstore.StoreError as exc:
        raise storage.LocationError(f"{flag} {loc}: {exc}") from None
    bucket = path.split("/", 1)[0]
    try:
        fs.info(bucket)  # raises what is wrong: no bucket, access denied, unreachable, timed out
    except FileNotFoundError:
        raise storage.LocationNotFound(f"{flag} {loc}: no such bucket {bucket!r}") from None
    except PermissionError as exc:  # HeadBucket refused: other probes of the bucket may still pass
        if not fs.exists(bucket):
            raise storage.LocationError(f"{flag} {loc}: {objectstore.describe(exc, loc)}") from None
    except Exception as exc:  # noqa: BLE001 - every store error names the location
        raise storage.LocationError(f"{flag} {loc}: {objectstore.describe(exc, loc)}") from None
    if not write:
        return
    probe = f"{path.rstrip('/')}/{PROBE}-{uuid.uuid4().hex[:8]}"
    try:
        fs.pipe_file(probe, b"ok\n")
        fs.rm_file(probe)
    except Exception as exc:  # noqa: BLE001 - every store error names the location
        raise storage.LocationError(f"{flag} {loc}: cannot write in it: {objectstore.describe(exc, loc)}") from None
