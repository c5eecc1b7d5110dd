"""``elastic-ctr cube build|server|agent|transfer``: the cube role's subcommands.

Each subcommand is registered by its own small function (one per owner), so the data
plane (build, server) and the control plane (agent, transfer) are edited independently.
Handlers import their modules lazily so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``cube`` and its subcommands to the top-level parser."""
    cube = sub.add_parser("cube", help="the cube sparse-parameter service: build, server, agent, transfer")
    cube_sub = cube.add_subparsers(dest="cube_command", metavar="CUBE_COMMAND")
    cube_sub.required = True
    for fn in _REGISTRARS:
        fn(cube_sub)


# --------------------------------------------------------------------------- control plane


def register_agent(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube agent``: downloads, unpacks, reloads and enables versions for one server."""
    p = cube_sub.add_parser("agent", help="agent beside one cube server (download, reload, enable)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8902, help="HTTP port (default 8902)")
    p.add_argument("--server-http", default="http://127.0.0.1:8901",
                   help="the cube server's HTTP control URL (default http://127.0.0.1:8901)")
    p.add_argument("--work-dir", required=True, help="directory for downloaded and unpacked versions")
    p.add_argument("--load-timeout", type=float, default=300.0,
                   help="seconds to wait for the server's background load (default 300)")

    def handler(args: argparse.Namespace) -> int:
        from runtime.cube import agent

        return agent.main(args)

    p.set_defaults(handler=handler)


def register_transfer(cube_sub: "argparse._SubParsersAction") -> None:
    """``cube transfer``: watches the donefile and rolls versions out to every instance."""
    p = cube_sub.add_parser("transfer", help="watch the donefile, build, publish and roll out versions")
    p.add_argument("--topology", required=True, help="topology JSON file (docs/contracts.md)")
    p.add_argument("--root", required=True,
                   help="version root: a directory or the file server's URL (donefile = ROOT/donefile/)")
    p.add_argument("--work-dir", required=True, help="directory for builds and the persisted state")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8910, help="HTTP port (default 8910)")
    p.add_argument("--upload-token-file", default=None,
                   help="file holding the upload bearer token (default $ELASTIC_CTR_UPLOAD_TOKEN)")
    p.add_argument("--poll-interval", type=float, default=5.0, help="donefile poll interval in s (default 5)")
    p.add_argument("--publish-url", default=None,
                   help="URL at which agents download ROOT/cube/ (default: ROOT itself, a URL or a path "
                        "the agents can read)")
    p.add_argument("--dict-name", default=None, help="dict name (default: the topology's dict_name)")
    p.add_argument("--phase-timeout", type=float, default=300.0,
                   help="seconds allowed for each of download, reload and enable (default 300)")
    p.add_argument("--retries", type=int, default=3,
                   help="attempts per instance and phase before the rollout aborts (default 3)")
    p.add_argument("--max-rollout-attempts", type=int, default=3,
                   help="rollouts of one version before it is given up (default 3)")
    p.add_argument("--once", action="store_true", help="roll out what the donefile holds, then exit")

    def handler(args: argparse.Namespace) -> int:
        from runtime.cube import transfer

        return transfer.main(args)

    p.set_defaults(handler=handler)


# Data-plane registrars (build, server) go before these; one function per subcommand.
_REGISTRARS = [register_agent, register_transfer]
