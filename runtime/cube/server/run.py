"""``elastic-ctr cube server``: runs one ``CubeServer`` until SIGTERM/SIGINT, then stops it
gracefully (the package docstring: readiness false, ``--prestop-seconds``, lookups received
are answered within ``--grace-period-seconds``). Options: ``runtime/cube/cli.py``."""
from __future__ import annotations

import logging
import time

from runtime.cube.server.core import CubeServer

log = logging.getLogger(__name__)


def main(args) -> int:
    """Serves with ``args`` (the ``cube server`` options) until a stop signal; returns the
    exit code (0)."""
    from runtime import auth, bound_ports
    from runtime.web.stop import StopSignal

    guard = auth.control_guard("cube-server", args.insecure_no_auth)
    srv = CubeServer(args.shard, args.shard_num, args.dict_name, host=args.host, port=args.port,
                     http_port=args.http_port, data_dir=args.data_dir, max_keys=args.max_keys,
                     verify=not args.no_verify, io_mode=args.io_mode, guard=guard,
                     load_roots=args.load_root)
    if args.load_root is None:
        log.warning("cube server: no --load-root: a load may name any directory this process can read")
    stop = StopSignal()
    srv.start()
    bound_ports.write(args.port_file, {"data": srv.port, "http": srv.http_port})
    name = stop.wait()
    prestop_s, grace_s = float(args.prestop_seconds), float(args.grace_period_seconds)
    log.info("cube server: %s received, stopping (readiness false, preStop delay %.1f s, then up to %.1f s for the "
             "lookups in flight)", name, prestop_s, grace_s)
    srv.unready("terminating")
    if prestop_s > 0:
        time.sleep(prestop_s)
    srv.stop(grace_s=max(grace_s, 0.001))
    log.info("cube server stopped")
    return 0
