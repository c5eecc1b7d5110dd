"""Locations: a local path, an HTTP(S) URL, or an object store / HDFS location (``s3://``,
``gs://``, ``hdfs://``, ``webhdfs://``: through fsspec, ``runtime.objectstore``), read,
listed, downloaded and uploaded alike.

Used by the trainer (input data, export upload), the cube transfer (donefile, SequenceFile
inputs, publishing shard tars), the cube agent (downloads) and serving (dense model).

Writing (uploads, appends, removal) is ``runtime.storage_write``'s: HTTP ``PUT`` with a
token from ``--upload-token-file`` or ``$ELASTIC_CTR_UPLOAD_TOKEN`` (``read_token``), else
the ``fileserver-write`` credential. Every other HTTP request of ``session()`` presents the
``fileserver-read`` credential when one is configured (a read-protected file server,
``--read-auth``).

Version layout under a root (a directory or the file server's URL), see docs/contracts.md:
``donefile/base.txt``, ``donefile/patch.txt`` and ``versions/<id>/{dense,sparse}/``.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator
from urllib.parse import urljoin, urlparse

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from runtime import auth, objectstore, role_specs

TOKEN_ENV = "ELASTIC_CTR_UPLOAD_TOKEN"
CHUNK = 1 << 20  # bytes per streamed chunk

_session: requests.Session | None = None


def umask_mode() -> int:
    """0o666 less the process umask: the mode ``open()`` would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


class LocationError(OSError):
    """A location (path or URL) could not be read or written; the message names it."""


class LocationNotFound(LocationError):
    """The location does not exist (a missing file, HTTP 404, a missing object or bucket)."""


def is_store(location: str) -> bool:
    """True for object-store and HDFS locations (``s3://``, ``gs://``, ``hdfs://``, ...)."""
    return objectstore.is_store(location)


def is_remote(location: str) -> bool:
    """True for every location that is not a local path (HTTP(S) or a store): one that
    must be downloaded to be used as a file."""
    return is_url(location) or is_store(location)


def store_error(location: str, exc: BaseException, what: str = "") -> LocationError:
    cls = LocationNotFound if isinstance(exc, FileNotFoundError) else LocationError
    return cls(f"{what}{location}: {objectstore.describe(exc, location)}")


def is_url(location: str) -> bool:
    """True for ``http://`` and ``https://`` locations."""
    return urlparse(str(location)).scheme in ("http", "https")


class _ReadCredential(requests.auth.AuthBase):
    """Adds ``Authorization: Bearer <fileserver-read credential>`` to a request that has no
    ``Authorization`` of its own, when that credential is configured (re-read on change)."""

    def __init__(self):
        self.credential: auth.Credential | None = None

    def __call__(self, r):
        if "Authorization" not in r.headers:
            d = auth.credentials_dir()  # as the environment says now
            if self.credential is None or self.credential.dir.parent != d:
                self.credential = auth.Credential(role_specs.FILES_READ, d)
            r.headers.update(self.credential.headers())
        return r


def session() -> requests.Session:
    """A process-wide ``requests.Session`` with pooled connections and bounded retries
    (3 retries, exponential backoff, on connection errors and 502/503/504), presenting
    the ``fileserver-read`` credential when one is configured (``_ReadCredential``)."""
    global _session
    if _session is None:
        s = requests.Session()
        s.auth = _ReadCredential()
        retry = Retry(total=3, backoff_factor=0.2, status_forcelist=(502, 503, 504),
                      allowed_methods=None, raise_on_status=False)
        adapter = HTTPAdapter(max_retries=retry, pool_connections=16, pool_maxsize=16)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        _session = s
    return _session


def join(base: str, *parts: str) -> str:
    """Joins path segments onto a path or URL base (``join('http://h/a', 'b/c')`` ->
    ``http://h/a/b/c``). An absolute URL or absolute path in ``parts`` replaces the base."""
    out = str(base)
    for p in parts:
        p = str(p)
        if is_remote(p) or os.path.isabs(p):
            out = p
        elif is_url(out):
            out = urljoin(out.rstrip("/") + "/", p)
        elif is_store(out):
            out = out.rstrip("/") + "/" + p.lstrip("/")
        else:
            out = os.path.join(out, p)
    return out


def read_token(token_file: str | None = None) -> str | None:
    """The upload token from ``token_file`` or ``$ELASTIC_CTR_UPLOAD_TOKEN`` (None if
    neither is set). Raises ``LocationError`` if ``token_file`` cannot be read."""
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except OSError as exc:
            raise LocationError(f"upload token file {token_file}: {exc}") from exc
    tok = os.environ.get(TOKEN_ENV)
    return tok.strip() if tok else None


def check_readable(location: str, timeout_s: float = 10.0) -> None:
    """Raises ``LocationError`` naming ``location`` unless it exists (HEAD for URLs,
    a glob match for paths, an object or a prefix with objects for stores)."""
    if is_store(location):
        if not expand(location):
            raise LocationNotFound(f"{location}: no such object (or the prefix/glob matches none)")
        return
    if is_url(location):
        try:
            r = session().head(location, timeout=timeout_s, allow_redirects=True)
        except requests.RequestException as exc:
            raise LocationError(f"{location}: unreachable ({exc.__class__.__name__}: {exc})") from exc
        if r.status_code >= 400:
            raise LocationError(f"{location}: HTTP {r.status_code}")
        return
    if not expand(location):
        raise LocationError(f"{location}: no such file")


def exists(location: str, timeout_s: float = 10.0) -> bool:
    """True if the file ``location`` exists (HTTP: ``HEAD`` answers 2xx; 404 = False).
    Raises ``LocationError`` for an unreachable server or another HTTP error."""
    if is_store(location):
        try:
            return objectstore.exists(location)
        except Exception as exc:  # noqa: BLE001 - every store error names the location
            raise store_error(location, exc) from exc
    if not is_url(location):
        return os.path.isfile(location)
    try:
        r = session().head(location, timeout=timeout_s, allow_redirects=True)
    except requests.RequestException as exc:
        raise LocationError(f"{location}: unreachable ({exc.__class__.__name__}: {exc})") from exc
    if r.status_code == 404:
        return False
    if r.status_code >= 400:
        raise LocationError(f"{location}: HTTP {r.status_code}")
    return True


def list_dir(location: str, timeout_s: float = 10.0) -> list[tuple[str, str]]:
    """The entries of directory ``location``: sorted ``[(name, "file" | "dir")]``.

    A URL must be a directory of the project's file server, which lists a directory as
    JSON (``GET <dir>/?format=json``, ``runtime.fileserver.app``). Raises
    ``LocationError`` for a missing directory, an unreachable server or another listing.
    A store location is a prefix, listed through fsspec (its "directories" are the common
    prefixes).
    """
    if is_store(location):
        try:
            return objectstore.list_dir(location)
        except Exception as exc:  # noqa: BLE001
            raise store_error(location, exc, "cannot list ") from exc
    if not is_url(location):
        try:
            with os.scandir(location) as it:
                return sorted((e.name, "dir" if e.is_dir() else "file") for e in it)
        except OSError as exc:
            raise LocationError(f"{location}: cannot list ({exc})") from exc
    url = location.rstrip("/") + "/"
    try:
        r = session().get(url, params={"format": "json"}, timeout=timeout_s)
    except requests.RequestException as exc:
        raise LocationError(f"{url}: unreachable ({exc.__class__.__name__}: {exc})") from exc
    if r.status_code >= 400:
        raise LocationError(f"{url}: HTTP {r.status_code}")
    try:
        entries = r.json()["entries"]
        return sorted((str(e["name"]), "dir" if e["type"] == "dir" else "file") for e in entries)
    except (ValueError, KeyError, TypeError) as exc:
        raise LocationError(f"{url}: not a JSON directory listing of the file server ({exc})") from None


def expand(pattern: str) -> list[str]:
    """A path or glob -> the sorted list of matching regular files; a directory expands to
    the files directly inside it. URLs are returned as they are. A store location, prefix
    or glob expands to the full locations of its objects (``s3://b/k``); raises
    ``LocationError`` for a store error (a missing bucket, denied access)."""
    if is_store(pattern):
        try:
            return objectstore.expand(pattern)
        except Exception as exc:  # noqa: BLE001
            raise store_error(pattern, exc) from exc
    if is_url(pattern):
        return [pattern]
    if os.path.isdir(pattern):
        return sorted(str(p) for p in Path(pattern).iterdir() if p.is_file())
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


def _http_get(location: str, timeout_s: float, stream: bool = False,
              follow_redirects: bool = True) -> requests.Response:
    """A GET of the URL ``location`` that answered below 400 (``follow_redirects`` False:
    a redirect is an error, not followed). Raises ``LocationNotFound`` for a 404,
    ``LocationError`` naming the location for any other failure."""
    try:
        r = session().get(location, stream=stream, timeout=timeout_s, allow_redirects=follow_redirects)
    except requests.RequestException as exc:
        raise LocationError(f"{location}: unreachable ({exc})") from exc
    if r.is_redirect:
        r.close()
        raise LocationError(f"{location}: HTTP {r.status_code} redirect to {r.headers.get('Location')!r} "
                            "not followed")
    if r.status_code >= 400:
        r.close()
        cls = LocationNotFound if r.status_code == 404 else LocationError
        raise cls(f"{location}: HTTP {r.status_code}")
    return r


@contextlib.contextmanager
def _located(location: str) -> Iterator[None]:
    """Maps the ``OSError`` of a local path and any failure of an object-store call in the
    block to ``LocationNotFound`` (missing) or ``LocationError``, naming ``location``."""
    try:
        yield
    except LocationError:
        raise
    except Exception as exc:  # noqa: BLE001 - an object store's client raises its own types
        if is_store(location):
            raise store_error(location, exc) from exc
        if isinstance(exc, OSError):
            cls = LocationNotFound if isinstance(exc, FileNotFoundError) else LocationError
            raise cls(f"{location}: {exc.strerror or exc}") from exc
        raise


def open_stream(location: str, timeout_s: float = 30.0, follow_redirects: bool = True) -> IO[bytes]:
    """Opens a path or URL for streamed binary reading (a URL is never loaded whole).
    ``follow_redirects`` False: an HTTP redirect is an error, not followed.

    Raises ``LocationError`` naming the location if it is missing or unreachable
    (``LocationNotFound`` if it is missing).
    """
    if is_url(location):
        r = _http_get(location, timeout_s, stream=True, follow_redirects=follow_redirects)
        r.raw.decode_content = True
        return r.raw  # type: ignore[return-value]
    with _located(location):
        return objectstore.open_read(location) if is_store(location) else open(location, "rb")


def iter_lines(location: str, encoding: str = "utf-8") -> Iterator[str]:
    """Streams the text lines of a path or URL (``.gz`` is decompressed), without the
    trailing newline."""
    raw = open_stream(location)
    try:
        stream: IO[bytes] = raw
        if str(location).endswith(".gz"):
            import gzip

            stream = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        text = io.TextIOWrapper(stream, encoding=encoding, errors="replace", newline="")
        for line in text:
            yield line.rstrip("\r\n")
    finally:
        raw.close()


def read_bytes(location: str, timeout_s: float = 30.0, follow_redirects: bool = True) -> bytes:
    """The whole content of a small path or URL (donefiles, metadata); ``follow_redirects``
    False: an HTTP redirect is an error. Raises ``LocationNotFound`` if it does not exist,
    ``LocationError`` for other failures."""
    if is_url(location):
        return _http_get(location, timeout_s, follow_redirects=follow_redirects).content
    with _located(location):
        if is_store(location):
            return objectstore.read_bytes(location)
        with open(location, "rb") as f:
            return f.read()


def file_digest(path: str | os.PathLike, algorithm: str) -> str:
    """Hex digest (``hashlib`` name ``algorithm``: md5, sha256) of a local file, read in
    1 MiB chunks. Raises ``OSError``, ``ValueError`` for an unknown algorithm."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def md5_file(path: str | os.PathLike) -> str:
    """Hex MD5 digest of a local file (the shard tars' published md5)."""
    return file_digest(path, "md5")


def download(location: str, dest: str | os.PathLike, md5: str | None = None,
             timeout_s: float = 60.0, follow_redirects: bool = True) -> str:
    """Copies a path or URL to ``dest`` through a temporary file renamed into place
    (``follow_redirects`` False: an HTTP redirect is an error).

    If ``md5`` (hex) is given the copy is verified first and, on mismatch, deleted and
    ``LocationError`` raised; nothing is left at ``dest``. Returns the hex MD5.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.md5()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out, open_stream(location, timeout_s, follow_redirects) as src:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
        got = h.hexdigest()
        if md5 and got != md5.lower():
            raise LocationError(f"{location}: md5 mismatch (expected {md5}, got {got})")
        os.chmod(tmp, umask_mode())
        os.replace(tmp, dest)
        return got
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
