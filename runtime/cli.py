"""The ``elastic-ctr`` command line: one entry point with a subcommand per role.

Containers run these same subcommands, so the local pipeline and the pods execute the
same code paths with the same environment contract. Each role package registers its
own subcommands (``register(subparsers)`` in its ``cli`` module); heavy imports (Paddle,
numpy-heavy modules, Flask) happen inside the handlers so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default (argparse's own), except where there is none
    (None, False) or the help text already says what happens without the option."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return text
        return super()._get_help_string(action)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``HelpFormatter`` keeping the description's own line breaks."""


# Role modules and the top-level subcommands each contributes, in the order they appear in
# --help.
_ROLE_MODULES = {
    "runtime.trainer.cli": ("data", "train"),
    "runtime.trainer.schema_cli": ("schema",),
    "runtime.fileserver.cli": ("fileserver",),
    "runtime.cube.cli": ("cube", "rollback"),
    "runtime.serving.cli": ("serve", "client"),
    "runtime.local.cli": ("local",),
    "infra.cli": ("render",),
}


def command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a top-level option or
    its value), or None when there is none (``--help``, no arguments)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--log-level":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Builds the top-level parser. With ``command`` (a subcommand name) only the role module
    that contributes it is imported and registered, so a role starts without importing the
    others (e.g. the cube server never imports the trainer's config model); with None, or a
    name no module contributes (argparse then names the choices), every role's."""
    parser = argparse.ArgumentParser(
        prog="elastic-ctr", formatter_class=HelpFormatter,
        description="CTR pipeline: Paddle parameter-server training, the cube sparse-parameter "
        "service, serving, and the Pulumi program that deploys them.",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("ELASTIC_CTR_LOG_LEVEL", "INFO"),
        help="logging level (default: $ELASTIC_CTR_LOG_LEVEL, else INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules = [m for m, cmds in _ROLE_MODULES.items() if command in cmds] or list(_ROLE_MODULES)
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a role not installed in this image
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` and runs the chosen subcommand; returns the process exit code."""
    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["train"] and "--local-cluster" not in raw and os.environ.get("TRAINING_ROLE") != "PSERVER":
        from runtime.trainer.stop import StopSignal  # before any import starts a thread

        StopSignal().install()
    parser = build_parser(command_of(raw))
    args = parser.parse_args(raw)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"{args.command}: missing subcommand")
    from runtime.auth import CredentialError

    try:
        rc = handler(args)
    except CredentialError as exc:  # a role started without the credential it needs
        print(f"elastic-ctr: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # SIGTERM to a launcher: its roles are stopped, exit 0
        from runtime.proc import Terminated

        return 0 if isinstance(exc, Terminated) else 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
