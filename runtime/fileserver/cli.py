"""``elastic-ctr fileserver``: serves a directory tree (listing, Range, ETag) and takes
token-authenticated uploads, until SIGTERM."""
from __future__ import annotations

import argparse
import logging
import os

from runtime import bound_ports, role_specs
from runtime.cli import HelpFormatter
from runtime.web.stop import add_prestop_seconds

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
                   help="file holding a fixed upload bearer token (default: $ELASTIC_CTR_UPLOAD_TOKEN, else the "
                        "fileserver-write credential of $ELASTIC_CTR_CREDENTIALS_DIR, re-read on change)")
    p.add_argument("--read-auth", action="store_true",
                   help="GET/HEAD of files and listings need the fileserver-read (or -write) credential "
                        "(probes and /metrics stay open)")
    p.add_argument("--threads", type=int, default=8, help="worker threads")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="refuse uploads larger than this many bytes (default: unlimited)")
    add_prestop_seconds(p)
    bound_ports.add_flag(p)
    p.set_defaults(handler=_run)


def _run(args) -> int:
    from runtime import storage
    from runtime.fileserver.app import create_app
    from runtime.web.stop import serve_forever
    from runtime.web.wsgi import WebServer

    from runtime import auth, role_specs

    token = storage.read_token(args.upload_token_file)
    write = auth.Credential(role_specs.FILES_WRITE)
    if token or write.current() is None:
        write = None  # a fixed token (or none: uploads disabled)
    read = auth.Credential(role_specs.FILES_READ).require("fileserver") if args.read_auth else None
    server = WebServer(create_app(args.root, token, args.max_body_bytes, write=write, read=read), args.host,
                       args.port, threads=args.threads, name="fileserver")
    log.info("file server: root %s (uploads %s; reads %s)", os.path.realpath(args.root),
             "enabled: fixed token" if token else f"enabled: {write.dir}" if write else "disabled: no token",
             "need a credential" if read else "open")
    return serve_forever(server, prestop_s=args.prestop_seconds, port_file=args.port_file)
