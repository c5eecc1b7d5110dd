"""``elastic-ctr cube build|server|agent|transfer``: the cube role's subcommands.

Each subcommand is registered by its own small function (one per owner), so the data
plane (build, server) and the control plane (agent, transfer) are edited independently.
Handlers import their modules lazily so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse

from runtime import bound_ports, role_specs
from runtime.auth import INSECURE_HELP
from runtime.cli import HelpFormatter, runs_main
from runtime.web.stop import add_prestop_seconds


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``cube`` and its subcommands to the top-level parser."""
    cube = sub.add_parser("cube", formatter_class=HelpFormatter, help="the cube sparse-parameter service: build, server, agent, transfer",
                          description="The cube: the sharded (key % shards), replicated sparse-parameter service. "
                          "A version is built into per-shard dicts (build), published, downloaded and loaded by each "
                          "replica's agent and server, and rolled out to every shard x replica by the transfer "
                          "(docs/cube.md).")
    cube_sub = cube.add_subparsers(dest="cube_command", metavar="CUBE_COMMAND")
    cube_sub.required = True
    for fn in _REGISTRARS:
        fn(cube_sub)
    register_rollback(sub)


def register_rollback(sub: "argparse._SubParsersAction") -> None:
    """``elastic-ctr rollback``: pins a version through the transfer's ``POST /rollback``
    and waits until it is served (``runtime.cube.transfer.rollback``)."""
    p = sub.add_parser("rollback", formatter_class=HelpFormatter,
                       help="serve a chosen version (pin it) or follow training again (--follow)",
                       description="Serve a chosen version (pin it) or follow training again, through the cube "
                       "transfer's POST /rollback, with the cube-control credential of "
                       "$ELASTIC_CTR_CREDENTIALS_DIR (on a cluster: port-forward the transfer first; docs: Rollback "
                       "on a cluster). Exit codes: 0 served (or the pin lifted), 1 refused or not served in time, "
                       "2 the transfer unreachable or the credential missing or wrong.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--to", type=int, metavar="VERSION", help="the version id to serve")
    which.add_argument("--follow", action="store_true", help="lift the pin: follow the donefiles again")
    p.add_argument("--transfer-url", default=f"http://{role_specs.LOOPBACK}:{role_specs.PORTS['cube-transfer']['http']}",
                   help="the cube transfer's base URL")
    p.add_argument("--wait", type=float, default=300.0,
                   help="seconds to wait until every replica serves VERSION (0 = do not wait)")

    def handler(args: argparse.Namespace) -> int:
        from runtime.cube.transfer.rollback import request_rollback

        return request_rollback(args.transfer_url, None if args.follow else args.to, args.wait)

    p.set_defaults(handler=handler)


# --------------------------------------------------------------------------- data plane


def register_build(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube build``: SequenceFiles -> per-shard dicts, tars, md5s (runtime/cube/builder/)."""
    p = cube_sub.add_parser("build", formatter_class=HelpFormatter, help="build per-shard dicts (base or delta) from SequenceFiles",
                                description="Build per-shard dicts (base or delta) from the trainer's SequenceFiles "
                                "(docs/contracts.md): OUTPUT/DICT/VERSION/ with each shard's tar and md5 "
                                "(runtime/cube/builder/).")
    p.add_argument("--input", nargs="+", required=True,
                   help="SequenceFiles: paths, directories, globs or URLs (read in this order; last wins)")
    p.add_argument("--output", required=True, help="output root (writes OUTPUT/DICT/VERSION/)")
    p.add_argument("--dict", required=True, help="dict name")
    p.add_argument("--shards", type=int, required=True, help="shard count (shard = key %% shards)")
    p.add_argument("--version", type=int, required=True, help="version id of this build")
    p.add_argument("--mode", choices=("base", "delta"), default="base", help="base or delta")
    p.add_argument("--base-version", type=int, default=None, help="for a delta: the version it applies to")

    runs_main(p, "runtime.cube.builder")


def register_server(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube server``: one shard over the binary data plane, HTTP control (runtime/cube/server/)."""
    p = cube_sub.add_parser("server", formatter_class=HelpFormatter, help="serve one shard (binary data plane + HTTP control/metrics)",
                                description="Serve one shard of the cube: batch lookups of uint64 keys on the binary "
                                "data plane (--port), the versions it holds, /metrics and the control endpoints on "
                                "HTTP (--http-port).")
    p.add_argument("--shard", type=int, required=True, help="this server's shard index")
    p.add_argument("--shard-num", type=int, default=1, help="shard count")
    p.add_argument("--dict-name", default=role_specs.DICT_NAME, help="dict name")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=role_specs.PORTS["cube-server"]["data"], help="data-plane TCP port")
    p.add_argument("--http-port", type=int, default=role_specs.PORTS["cube-server"]["http"], help="HTTP control/metrics port")
    p.add_argument("--data-dir", default=None,
                   help="where the enabled version is recorded, to serve it again after a restart")
    p.add_argument("--max-keys", type=int, default=1 << 20,
                   help="largest batch accepted, in keys; bigger frames are refused")
    p.add_argument("--no-verify", action="store_true", help="skip the crc32 check of loaded dicts")
    p.add_argument("--io-mode", choices=("epoll", "threads"), default="epoll",
                   help="data-plane I/O: one epoll thread for every connection, or a thread each")
    p.add_argument("--insecure-no-auth", action="store_true", help=INSECURE_HELP)
    p.add_argument("--load-root", action="append", default=None,
                   help="load dicts only from under this directory (repeatable; the agent's work directory)")
    add_prestop_seconds(p)
    bound_ports.add_flag(p)
    p.add_argument("--grace-period-seconds", type=float, default=10.0,
                   help="on SIGTERM, after the preStop delay: seconds the lookups already received get to be "
                   "answered before the remaining connections are closed")

    runs_main(p, "runtime.cube.server")


# --------------------------------------------------------------------------- control plane


def register_agent(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube agent``: downloads, unpacks, reloads and enables versions for one server."""
    p = cube_sub.add_parser("agent", formatter_class=HelpFormatter, help="agent beside one cube server (download, reload, enable)",
                                description="The agent beside one cube server: downloads a version's shard, checks "
                                "it, has the server load it and enable it, as the transfer asks.")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=role_specs.PORTS["cube-agent"]["agent"], help="HTTP port")
    p.add_argument("--server-http", default=f"http://{role_specs.LOOPBACK}:{role_specs.PORTS['cube-server']['http']}",
                   help="the cube server's HTTP control URL")
    p.add_argument("--work-dir", required=True, help="directory for downloaded and unpacked versions")
    p.add_argument("--load-timeout-seconds", type=float, default=300.0,
                   help="seconds to wait for the server's background load")
    p.add_argument("--insecure-no-auth", action="store_true", help=INSECURE_HELP + "; presents none to the server")
    p.add_argument("--version-root", action="append", default=None,
                   help="download only URLs under this prefix (repeatable; where the transfer publishes, "
                        "e.g. http://fileserver:8080/cube/); the md5 must be the one published beside the tar")
    add_prestop_seconds(p)
    bound_ports.add_flag(p)

    runs_main(p, "runtime.cube.agent")


def register_transfer(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube transfer``: watches the donefile and rolls versions out to every replica."""
    p = cube_sub.add_parser("transfer", formatter_class=HelpFormatter, help="watch the donefile, build, publish and roll out versions",
                                description="The transfer: watches the donefiles under --root, builds each version "
                                "into per-shard dicts, publishes them and rolls them out to every shard x replica "
                                "with barriers; /dict/info names the version served, POST /rollback pins one.")
    p.add_argument("--topology", required=True, help="topology JSON file (docs/contracts.md)")
    p.add_argument("--root", required=True,
                   help="version root: a directory or the file server's URL (donefile = ROOT/donefile/)")
    p.add_argument("--work-dir", required=True, help="directory for builds and the persisted state")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=role_specs.PORTS["cube-transfer"]["http"], help="HTTP port")
    p.add_argument("--upload-token-file", default=None,
                   help="file holding the upload bearer token")
    p.add_argument("--poll-seconds", type=float, default=5.0, help="donefile poll interval in s")
    p.add_argument("--publish-url", default=None,
                   help="URL at which agents download ROOT/cube/ (default: ROOT itself, a URL or a path "
                        "the agents can read)")
    p.add_argument("--dict-name", default=None, help="dict name (default: the topology's dict_name)")
    p.add_argument("--no-coalesce", action="store_true",
                   help="roll every patch out on its own, even when several are queued (default: the queued "
                        "patches go out as one rollout, the newest row winning; runtime/cube/transfer/coalesce.py)")
    p.add_argument("--pin-version", type=int, default=None,
                   help="serve this version (its chain laid out as one base) instead of following the "
                        "donefiles; left out: follow them (the stack's servedVersion)")
    p.add_argument("--keep-versions", type=int, default=0,
                   help="published versions kept under the root; older ones are deleted, never the served "
                        "chain's nor a pinned one's (0 = keep all; the stack's keepVersions)")
    add_prestop_seconds(p)
    bound_ports.add_flag(p)
    p.add_argument("--once", action="store_true", help="roll out what the donefile holds, then exit")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="no cube-control credential: none presented to the agents (they must run with "
                        "--insecure-no-auth) nor asked for POST /rollback")
    p.add_argument("--model-gate", choices=("on", "off"), default="on",
                   help="hold a version worse than the previous one on its rows set aside "
                        "(runtime/cube/transfer/model_gate.py; versions without an evaluation pass)")
    # the rollout's time limits and retries, and the model gate's thresholds
    for flag, kind, default, text in (
            ("--phase-timeout-seconds", float, 300.0, "seconds allowed for each of download, reload and enable"),
            ("--retries", int, 3, "attempts per replica and phase before the rollout aborts"),
            ("--max-rollout-attempts", int, 3, "rollouts of one version before it is given up"),
            ("--rollout-backoff-seconds", float, 10.0, "seconds before a failed rollout is retried, doubled per attempt, <= 300"),
            ("--reconcile-every-seconds", float, 30.0, "seconds between checks for replicas lagging behind the served "
                                                  "version, which are then brought up to it (0 = never)"),
            ("--grace-period-seconds", float, 20.0, "on SIGTERM, seconds to wait for the step in progress before exiting "
                                            "(its rollout resumes at the next start)"),
            ("--model-gate-auc-drop", float, 0.05, "model gate: largest AUC drop below the previous version's"),
            ("--model-gate-logloss-ratio", float, 1.25,
             "model gate: largest ratio of the log loss to the previous version's"),
            ("--model-gate-calibration", float, 2.5,
             "model gate: largest factor between mean prediction and click rate (either way)"),
            ("--model-gate-min-rows", int, 500, "model gate: an evaluation on fewer rows set aside is not judged "
                                                "(the version passes)")):
        p.add_argument(flag, type=kind, default=default, help=text)

    runs_main(p, "runtime.cube.transfer.app")


# One function per subcommand: data plane (build, server), then control plane (agent, transfer).
_REGISTRARS = [register_build, register_server, register_agent, register_transfer]
