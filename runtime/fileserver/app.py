"""The file server's app: a directory tree over HTTP, with uploads (the storage role of
the pipeline: the trainer's export and the cube transfer upload to it through
``runtime.storage_write.upload``; the cube agents and serving download from it). Served by
``runtime.web.wsgi`` (``/healthz`` and ``/readyz`` come from there).

HTTP interface (every path is relative to ``--root``):

- ``GET|HEAD /<file>``: the file's bytes, with ``ETag``, ``Last-Modified``,
  ``Accept-Ranges: bytes``; honours ``Range`` (206 / 416), ``If-None-Match`` and
  ``If-Modified-Since`` (304), ``If-Range``. (Werkzeug's ``send_file`` conditional
  support, RFC 9110 sections 13-14.)
- ``GET|HEAD /<dir>/``: a listing. HTML by default; JSON with ``?format=json`` or
  ``Accept: application/json``::

      {"path": "/versions/", "entries": [{"name": "part-00000", "type": "file",
        "size": 1234, "mtime": 1700000000.5}, {"name": "dense", "type": "dir", ...}]}

  ``size`` in bytes (0 for a directory), ``mtime`` in Unix seconds (float); entries
  sorted by name; hidden upload temporaries (``.*``) are not listed.
- ``PUT /<file>``: upload. Requires ``Authorization: Bearer <credential>`` of
  ``fileserver-write`` (``runtime.auth``: 401 without it or with a wrong one, counted in
  ``elastic_ctr_auth_refusals_total``; 403 when the server has no write credential
  configured, i.e. uploads are disabled). The body is streamed to a temporary file in the target directory and
  renamed into place (a reader sees the old file or the new one, never a partial one);
  parent directories are created. When the request carries ``Content-MD5`` (base64 of
  the MD5, RFC 1864), ``Digest: md5=<base64>`` (RFC 3230) or
  ``Content-Digest``/``Repr-Digest: md5=:<base64>:`` (RFC 9530; ``sha-256`` also
  accepted), the digest is verified and a mismatch is a 400 with nothing kept.
  201 for a new file, 200 for a replaced one; body ``{"path", "size", "md5"}``.
- ``DELETE /<file or dir>``: removes it (a directory with all it holds; never the
  root), with the same ``Authorization`` as ``PUT``; 404 when missing. Body
  ``{"deleted"}``. Used by the transfer's retention of published versions.

Read protection (``read``, ``--read-auth``): ``GET``/``HEAD`` of files and listings
then need the ``fileserver-read`` credential (or the write one: a writer reads what it
wrote); ``/metrics`` and the probes stay open.

Path safety: a path can never name anything outside the root. ``..`` segments, NUL
bytes, backslashes and absolute paths are refused with 403 (percent-encoded variants
such as ``%2e%2e`` and ``%2f`` arrive decoded and are caught the same way); a symlink
inside the root that resolves outside it is 404 (and never listed).

``GET /metrics``: Prometheus text format (``runtime.metrics.fileserver``; a file named
``metrics`` at the top of the root is therefore not served).

Errors are JSON ``{"error": "..."}`` with a 4xx status.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import html
import logging
import os
import re
import shutil
import tempfile
from urllib.parse import quote

from flask import Flask, Response, jsonify, request, send_file

from runtime import auth
from runtime.metrics import exposition
from runtime.metrics.fileserver import FileServerMetrics
from runtime.web.wsgi import json_errors

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes per streamed read/write
TMP_PREFIX = ".upload-"  # temporaries of in-flight uploads (hidden from listings)


class PathRefused(Exception):
    """A request path that would leave the root (status 403) or names nothing (404)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def resolve(root_real: str, rel: str, must_exist: bool = True) -> str:
    """Maps a request path ``rel`` (already percent-decoded) onto the filesystem under
    ``root_real`` (a ``realpath``).

    Returns the absolute path. Raises ``PathRefused(403)`` for ``..`` segments, NUL,
    backslashes or absolute Windows-style paths, and ``PathRefused(404)`` when the
    resolved path (symlinks followed) lies outside the root, or, with ``must_exist``,
    does not exist.
    """
    if "\x00" in rel:
        raise PathRefused(403, "path contains a NUL byte")
    if "\\" in rel:
        raise PathRefused(403, "path contains a backslash")
    parts = []
    for seg in rel.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            raise PathRefused(403, "path contains a '..' segment")
        if re.match(r"^[A-Za-z]:", seg) and not parts:
            raise PathRefused(403, "absolute (drive) path refused")
        parts.append(seg)
    full = os.path.join(root_real, *parts) if parts else root_real
    real = os.path.realpath(full)
    if real != root_real and not real.startswith(root_real + os.sep):
        raise PathRefused(404, "not found")
    if must_exist and not os.path.exists(real):
        raise PathRefused(404, "not found")
    return real


def _wants_json() -> bool:
    if request.args.get("format") == "json":
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and request.accept_mimetypes["application/json"] > \
        request.accept_mimetypes["text/html"]


def _listing(root_real: str, real: str, rel: str) -> Response:
    entries = []
    with os.scandir(real) as it:
        for e in it:
            if e.name.startswith("."):
                continue
            try:
                target = os.path.realpath(e.path)
                if target != root_real and not target.startswith(root_real + os.sep):
                    continue  # a symlink out of the root: not shown
                st = os.stat(target)
            except OSError:
                continue
            is_dir = os.path.isdir(target)
            entries.append({"name": e.name, "type": "dir" if is_dir else "file",
                            "size": 0 if is_dir else st.st_size, "mtime": st.st_mtime})
    entries.sort(key=lambda x: x["name"])
    path = "/" + rel.strip("/") + ("/" if rel.strip("/") else "")
    if _wants_json():
        resp = jsonify({"path": path, "entries": entries})
        resp.headers["Cache-Control"] = "no-cache"
        return resp
    rows = []
    if path != "/":
        rows.append('<li><a href="../">../</a></li>')
    for e in entries:
        name = e["name"] + ("/" if e["type"] == "dir" else "")
        href = quote(path + name)
        size = "" if e["type"] == "dir" else f' ({e["size"]} bytes)'
        rows.append(f'<li><a href="{html.escape(href)}">{html.escape(name)}</a>{size}</li>')
    body = (f"<!doctype html><html><head><meta charset='utf-8'><title>Index of {html.escape(path)}"
            f"</title></head><body><h1>Index of {html.escape(path)}</h1><ul>\n"
            + "\n".join(rows) + "\n</ul></body></html>\n")
    return Response(body, mimetype="text/html", headers={"Cache-Control": "no-cache"})


_DIGEST_ALGS = {"md5": hashlib.md5, "sha-256": hashlib.sha256}


def expected_digests(headers) -> dict[str, bytes]:
    """The digests a request asks us to verify: ``{algorithm: raw digest bytes}``.

    Reads ``Content-MD5`` (RFC 1864), ``Digest`` (RFC 3230: ``md5=<b64>``,
    ``sha-256=<b64>``), ``Content-Digest`` and ``Repr-Digest`` (RFC 9530:
    ``md5=:<b64>:``). Unknown algorithms are ignored. Raises ``ValueError`` naming the
    header when a value is not valid base64 or has the wrong length.
    """
    out: dict[str, bytes] = {}

    def put(alg: str, b64: str, header: str) -> None:
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{header}: not valid base64") from None
        if len(raw) != _DIGEST_ALGS[alg]().digest_size:
            raise ValueError(f"{header}: wrong {alg} digest length")
        out[alg] = raw

    v = headers.get("Content-MD5")
    if v:
        put("md5", v, "Content-MD5")
    for header in ("Digest", "Content-Digest", "Repr-Digest"):
        v = headers.get(header)
        if not v:
            continue
        for item in v.split(","):
            if "=" not in item:
                continue
            alg, val = item.split("=", 1)
            alg = alg.strip().lower()
            if alg == "sha256":
                alg = "sha-256"
            if alg not in _DIGEST_ALGS:
                continue
            val = val.strip()
            if val.startswith(":") and val.endswith(":") and len(val) >= 2:
                val = val[1:-1]
            put(alg, val, header)
    return out


def create_app(root: str | os.PathLike, token: str | None = None,
               max_upload_bytes: int | None = None, write=None, read=None) -> Flask:
    """Builds the Flask app serving ``root``.

    ``token``: a fixed bearer token that authorizes uploads; ``write``: the
    ``fileserver-write`` credential (``runtime.auth.Credential``: current and previous,
    re-read on change) used when ``token`` is None (neither: uploads disabled, 403).
    ``read``: the ``fileserver-read`` credential; given, reads need it (module docstring).
    ``max_upload_bytes``: refuse larger uploads with 413 (None = unlimited).
    """
    root_real = os.path.realpath(root)
    os.makedirs(root_real, exist_ok=True)
    app = json_errors(Flask(__name__))
    app.config["MAX_CONTENT_LENGTH"] = None
    app.url_map.merge_slashes = False  # '//' is handled (ignored) by resolve(), not redirected
    app.url_map.strict_slashes = False
    metrics = FileServerMetrics()
    if token:
        write = auth.FixedCredential("fileserver-write", token)
    readers = tuple(c for c in (read, write) if c is not None)

    def needs(method: str, path: str):
        if method in ("PUT", "DELETE"):
            return (write,) if write is not None else ()
        if read is not None and path != "/metrics":
            return readers
        return ()

    auth.Guard("fileserver", needs, metrics.auth).install(app)

    @app.after_request
    def count(resp: Response) -> Response:
        metrics.answered(request.method, resp.status_code, resp.content_length)
        return resp

    @app.get("/metrics")
    def metrics_view():
        body, ctype = exposition(metrics.registry)
        return Response(body, mimetype=ctype)

    def err(status: int, message: str, headers: dict | None = None) -> Response:
        resp = jsonify({"error": message})
        resp.status_code = status
        if headers:
            resp.headers.update(headers)
        return resp

    @app.route("/", defaults={"rel": ""}, methods=["GET", "HEAD", "PUT", "DELETE"])
    @app.route("/<path:rel>", methods=["GET", "HEAD", "PUT", "DELETE"])
    def handle(rel: str):
        # Flask's <path:> converter gives the decoded path; take the raw decoded
        # PATH_INFO instead so that a trailing slash and '//' are seen as sent.
        rel = request.path[1:] if request.path.startswith("/") else request.path
        if request.method == "PUT":
            return put(rel)
        if request.method == "DELETE":
            return delete(rel)
        try:
            real = resolve(root_real, rel)
        except PathRefused as exc:
            return err(exc.status, f"/{rel}: {exc}")
        if os.path.isdir(real):
            return _listing(root_real, real, rel)
        if rel.endswith("/"):
            return err(404, f"/{rel}: not a directory")
        try:
            return send_file(real, conditional=True, etag=True, max_age=0,
                             download_name=os.path.basename(real))
        except OSError as exc:
            return err(404, f"/{rel}: {exc.strerror or exc}")

    def delete(rel: str) -> Response:
        """``DELETE`` (with the write credential, checked by the guard): removes a file, or a
        directory and all it holds (the transfer's retention of published versions); never the root."""
        if write is None:
            return err(403, "deletes are disabled: the file server has no write credential")
        if not rel.strip("/"):
            return err(400, "DELETE needs a path below the root")
        try:
            real = resolve(root_real, rel.rstrip("/"))
        except PathRefused as exc:
            return err(exc.status, f"/{rel}: {exc}")
        if os.path.isdir(real):
            shutil.rmtree(real)
        else:
            os.unlink(real)
        log.info("deleted /%s", rel)
        return jsonify({"deleted": "/" + rel})

    def put(rel: str) -> Response:
        if write is None:
            return err(403, "uploads are disabled: the file server has no upload token")
        if not rel or rel.endswith("/"):
            return err(400, f"/{rel}: PUT needs a file path, not a directory")
        try:
            real = resolve(root_real, rel, must_exist=False)
        except PathRefused as exc:
            return err(exc.status, f"/{rel}: {exc}")
        if os.path.isdir(real):
            return err(409, f"/{rel}: is a directory")
        try:
            want = expected_digests(request.headers)
        except ValueError as exc:
            return err(400, str(exc))
        length = request.content_length
        if max_upload_bytes is not None and length is not None and length > max_upload_bytes:
            return err(413, f"Content-Length {length} exceeds the limit of {max_upload_bytes} bytes")
        parent = os.path.dirname(real)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            return err(409, f"/{rel}: cannot create its directory: {exc.strerror or exc}")
        # The parent may itself be (or have become) a symlink out: check again.
        try:
            resolve(root_real, os.path.relpath(parent, root_real), must_exist=True)
        except PathRefused as exc:
            return err(exc.status, f"/{rel}: {exc}")
        hashers = {alg: _DIGEST_ALGS[alg]() for alg in set(want) | {"md5"}}
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=TMP_PREFIX)
        size = 0
        try:
            stream = request.stream
            with os.fdopen(fd, "wb") as out:
                while True:
                    chunk = stream.read(CHUNK)
                    if not chunk:
                        break
                    size += len(chunk)
                    if max_upload_bytes is not None and size > max_upload_bytes:
                        raise _TooLarge()
                    for h in hashers.values():
                        h.update(chunk)
                    out.write(chunk)
            if length is not None and size != length:
                os.unlink(tmp)
                return err(400, f"body: got {size} bytes, Content-Length said {length}")
            for alg, raw in want.items():
                got = hashers[alg].digest()
                if got != raw:
                    os.unlink(tmp)
                    return err(400, f"{alg} digest mismatch: header says "
                                    f"{base64.b64encode(raw).decode()}, body has "
                                    f"{base64.b64encode(got).decode()}; nothing kept")
            existed = os.path.exists(real)
            os.chmod(tmp, 0o644)
            os.replace(tmp, real)
        except _TooLarge:
            os.unlink(tmp)
            return err(413, f"body exceeds the limit of {max_upload_bytes} bytes")
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        log.info("stored /%s (%d bytes)", rel, size)
        metrics.uploaded.inc(size)
        resp = jsonify({"path": "/" + rel, "size": size, "md5": hashers["md5"].hexdigest()})
        resp.status_code = 200 if existed else 201
        return resp

    @app.errorhandler(Exception)
    def internal(e):  # HTTP errors (404, 405, abort) are json_errors'
        log.exception("unhandled error")
        return err(500, f"internal error: {e.__class__.__name__}")

    return app


class _TooLarge(Exception):
    pass
