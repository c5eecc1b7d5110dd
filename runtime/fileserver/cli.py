"""``elastic-ctr fileserver``: serves a directory tree (listing, Range, ETag) and takes
token-authenticated uploads, until SIGTERM."""
from __future__ import annotations

import argparse
import logging
import os

from runtime import role_specs
from runtime.cli import HelpFormatter
from runtime.webserver import add_drain_seconds

log = logging.getLogger(__name__)


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``fileserver`` to the top-level parser."""
    p = sub.add_parser(
        "fileserver", formatter_class=HelpFormatter,
        help="serve a directory tree over HTTP (listing, Range, ETag) with token-authenticated PUT uploads",
        description="File server: GET/HEAD files and listings (HTML, or JSON with ?format=json), PUT uploads "
                    "with 'Authorization: Bearer <token>' (token from --upload-token-file or "
                    "$ELASTIC_CTR_UPLOAD_TOKEN; without one, uploads are refused with 403).")
    p.add_argument("--root", required=True, help="directory to serve (created if missing)")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=role_specs.PORTS["fileserver"]["http"], help="listen port")
    p.add_argument("--upload-token-file", default=None,
                   help="file holding the upload bearer token (default: $ELASTIC_CTR_UPLOAD_TOKEN)")
    p.add_argument("--threads", type=int, default=8, help="worker threads")
    p.add_argument("--max-upload-bytes", type=int, default=None,
                   help="refuse uploads larger than this many bytes (default: unlimited)")
    add_drain_seconds(p)
    p.set_defaults(handler=_run)


def _run(args) -> int:
    from runtime import storage
    from runtime.fileserver.app import create_app
    from runtime.webserver import WebServer, serve_forever

    token = storage.read_token(args.upload_token_file)
    server = WebServer(create_app(args.root, token, args.max_upload_bytes), args.host, args.port,
                       threads=args.threads, name="fileserver")
    log.info("file server: root %s (uploads %s)", os.path.realpath(args.root),
             "enabled" if token else "disabled: no token")
    return serve_forever(server, drain_s=args.drain_seconds)
