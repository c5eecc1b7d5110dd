"""Where a cube agent may download from: the version roots (``--version-root``, the
locations the transfer publishes shard tars under, e.g. ``http://fileserver:8080/cube/``
or ``s3://bucket/models/cube/``) and the published md5 beside each tar.

A download URL is accepted when, normalized, it starts with a normalized root (a prefix
allowlist, compared per path segment). Normalizing: the scheme and host in lower case,
an explicit default port dropped; refused outright are local paths and ``file:`` URLs,
URLs with user info, a query or a fragment, and paths with an empty, ``.`` or ``..``
segment, a backslash or a NUL (also percent-encoded: ``%2e%2e``, ``%2f``, ``%5c``,
``%00`` are decoded before the check). Redirects are not followed (``runtime.storage``,
``follow_redirects=False``), so an answer cannot lead the download out of the root.

The md5 is the one published next to the tar (``<tar>.md5``, ``runtime.cube.buildinfo``),
read from the same root; the request's md5 must equal it. So a client that can reach the
agent's control port still cannot make it load anything but a published version.
"""
from __future__ import annotations

from typing import Optional, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

from runtime import storage
from runtime.cube.buildinfo import md5_name

_DEFAULT_PORTS = {"http": 80, "https": 443}


class SourceRefused(ValueError):
    """A download location outside the version roots (the message says why)."""


def normalize(url: str) -> str:
    """``url`` normalized (module docstring). Raises ``SourceRefused`` naming what is wrong."""
    url = str(url).strip()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not scheme or scheme == "file" or len(scheme) == 1:  # a path, a file URL, a drive letter
        raise SourceRefused(f"{url!r}: a local path or file URL; only published URLs are downloaded")
    if not (storage.is_url(url) or storage.is_store(url)):
        raise SourceRefused(f"{url!r}: scheme {scheme!r} is not http(s) or an object store")
    if parts.username is not None or parts.password is not None:
        raise SourceRefused(f"{url!r}: user info in the URL")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise SourceRefused(f"{url!r}: a query or fragment")
    host = (parts.hostname or "").lower()
    if not host:
        raise SourceRefused(f"{url!r}: no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise SourceRefused(f"{url!r}: {exc}") from None
    netloc = host if port in (None, _DEFAULT_PORTS.get(scheme)) else f"{host}:{port}"
    path = parts.path or "/"
    decoded = unquote(path)
    if "\\" in decoded or "\x00" in decoded:
        raise SourceRefused(f"{url!r}: a backslash or NUL in the path")
    segments = decoded.split("/")[1:]
    if any(s in (".", "..") for s in segments) or any(s == "" for s in segments[:-1]):
        raise SourceRefused(f"{url!r}: an empty, '.' or '..' path segment")
    if "%2f" in path.lower():
        raise SourceRefused(f"{url!r}: an encoded '/' in the path")
    return urlunsplit((scheme, netloc, path, "", ""))


class VersionRoots:
    """The version roots of an agent. ``roots`` empty: any http(s) or object-store URL
    (never a local path) is accepted, and still only with its published md5."""

    def __init__(self, roots: Sequence[str]):
        self.roots = []
        for r in roots:
            n = normalize(r)
            self.roots.append(n if n.endswith("/") else n + "/")

    def check(self, url: str) -> str:
        """The normalized ``url`` when it lies under a root. Raises ``SourceRefused``."""
        n = normalize(url)
        if self.roots and not any(n.startswith(r) for r in self.roots):
            raise SourceRefused(f"{url!r} is not under a version root ({', '.join(self.roots)})")
        if n.endswith("/"):
            raise SourceRefused(f"{url!r}: names a directory, not a shard tar")
        return n

    def published_md5(self, url: str, timeout_s: float = 30.0) -> str:
        """The hex md5 published next to the tar ``url`` (already ``check``-ed): the first
        token of ``<url>.md5``. Raises ``storage.LocationError`` (missing, unreachable, a
        redirect) or ``SourceRefused`` (not an md5)."""
        head, _, name = url.rpartition("/")
        raw = storage.read_bytes(f"{head}/{md5_name(name)}", timeout_s, follow_redirects=False)
        words = raw.decode("ascii", "replace").split()
        md5 = words[0].lower() if words else ""
        if len(md5) != 32 or any(c not in "0123456789abcdef" for c in md5):
            raise SourceRefused(f"{head}/{md5_name(name)}: not a hex md5")
        return md5


def roots_or_none(roots: Optional[Sequence[str]]) -> Optional[VersionRoots]:
    """``VersionRoots(roots)``, None for None (an agent built in-process without a check)."""
    return None if roots is None else VersionRoots(roots)
