"""Writing to a location: ``upload`` a file or a tree, ``append_line`` to a donefile, ``remove_tree``; a local path, an HTTP(S) URL (the file server's token-authenticated ``PUT``) or an object store alike.

Uploads are HTTP ``PUT`` with ``Authorization: Bearer <token>`` and a ``Content-MD5``
header (base64 of the MD5 digest, RFC 1864) that the file server verifies; without a
token, the ``fileserver-write`` credential (``runtime.auth``), read at each upload. A local
file is written beside its target and renamed into place. Reading, listing and
downloading are ``runtime.storage``'s.
"""
from __future__ import annotations

import base64
import os
import shutil
import tempfile
from pathlib import Path

import requests

from runtime import auth, objectstore, role_specs
from runtime.storage import (LocationError, is_store, is_url, join, md5_file, read_bytes, session, store_error,
                             umask_mode)


def upload(local: str | os.PathLike, location: str, token: str | None = None,
           timeout_s: float = 120.0) -> None:
    """Puts a local file at a path or URL.

    URL: ``PUT`` streamed with ``Authorization: Bearer <token>`` (``token`` None: the
    ``fileserver-write`` credential's current value, if configured) and ``Content-MD5``.
    Path: copied to a temporary file beside the target and renamed into place, so a
    reader never sees a half-written file. Store: one object, published whole
    (``objectstore.put_file``). Raises ``LocationError`` on failure.
    """
    if is_store(location):
        try:
            objectstore.put_file(local, location)
        except Exception as exc:  # noqa: BLE001
            raise store_error(location, exc, f"upload {local} -> ") from exc
        return
    if is_url(location):
        digest = base64.b64encode(bytes.fromhex(md5_file(local))).decode()
        headers = {"Content-MD5": digest}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        else:
            headers.update(auth.Credential(role_specs.FILES_WRITE).headers())
        try:
            with open(local, "rb") as f:
                r = session().put(location, data=f, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise LocationError(f"upload {local} -> {location}: {exc}") from exc
        if r.status_code >= 300:
            raise LocationError(f"upload {local} -> {location}: HTTP {r.status_code} {r.text[:200]}")
        return
    dest = Path(location)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(local, tmp)
        os.chmod(tmp, umask_mode())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def upload_tree(local_dir: str | os.PathLike, location: str, token: str | None = None) -> list[str]:
    """Uploads every file under ``local_dir`` to the same relative path under ``location``.
    Returns the list of relative paths uploaded (sorted)."""
    local_dir = Path(local_dir)
    rels = sorted(str(p.relative_to(local_dir)) for p in local_dir.rglob("*") if p.is_file())
    for rel in rels:
        upload(local_dir / rel, join(location, rel.replace(os.sep, "/")), token)
    return rels


def remove_tree(location: str, token: str | None = None, timeout_s: float = 60.0) -> None:
    """Removes a file or a directory tree (a prefix on a store) at ``location``; a missing
    one is not an error. URL: ``DELETE`` with ``Authorization: Bearer <token>`` (the file
    server). Raises ``LocationError`` naming the location."""
    if is_store(location):
        try:
            fs, path = objectstore.filesystem(location)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except Exception as exc:  # noqa: BLE001
            raise store_error(location, exc, "remove ") from exc
        return
    if is_url(location):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            r = session().delete(location, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise LocationError(f"remove {location}: {exc}") from exc
        if r.status_code >= 300 and r.status_code != 404:
            raise LocationError(f"remove {location}: HTTP {r.status_code} {r.text[:200]}")
        return
    try:
        if os.path.isdir(location):
            shutil.rmtree(location)
        elif os.path.lexists(location):
            os.unlink(location)
    except OSError as exc:
        raise LocationError(f"remove {location}: {exc}") from exc


def append_line(location: str, line: str, token: str | None = None) -> None:
    """Appends one line to a text file at a path or URL (the donefile protocol).

    The file is rewritten whole (read, append, write to a temp, rename / PUT), so a
    reader sees either the old content or the new, never a partial line. Donefiles are
    written by one exporter at a time (trainer 0), so read-modify-write is safe.
    A store location is appended with conditional writes and never twice
    (``objectstore.append_line``).
    """
    if is_store(location):
        try:
            objectstore.append_line(location, line)
        except Exception as exc:  # noqa: BLE001
            raise store_error(location, exc, "append to ") from exc
        return
    try:
        old = read_bytes(location)
    except LocationError:
        old = b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    data = old + line.rstrip("\n").encode() + b"\n"
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".txt") as f:
        f.write(data)
        tmp = f.name
    try:
        upload(tmp, location, token)
    finally:
        os.unlink(tmp)
