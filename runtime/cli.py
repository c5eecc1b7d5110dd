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


#: ``--log-level``'s choices (the ``logging`` module's level names)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Parser(argparse.ArgumentParser):
    """The parser of ``elastic-ctr`` and of every subcommand (``add_subparsers`` makes its
    subparsers of the parser's own class). A subcommand's parser refuses arguments it does
    not know itself, so the error shows that subcommand's usage, not the top level's; the
    innermost subcommand's ``prog`` is kept in the namespace as ``_prog`` (the name the
    error of a failed handler starts with)."""

    #: True for the top-level parser only (``build_parser``)
    top = False

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if not self.top:
            if extras:
                self.error("unrecognized arguments: " + " ".join(extras))
            if not getattr(namespace, "_prog", None):
                namespace._prog = self.prog
        return namespace, extras


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


def runs_main(p: argparse.ArgumentParser, module: str) -> None:
    """Makes ``p``'s handler ``module.main(args)``, the module imported only when the
    command runs (so ``--help`` imports none of the role's dependencies)."""
    p.set_defaults(handler=lambda args: importlib.import_module(module).main(args))


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
    parser = Parser(
        prog="elastic-ctr", formatter_class=HelpFormatter,
        description="CTR pipeline: Paddle parameter-server training, the cube sparse-parameter "
        "service, serving, and the Pulumi program that deploys them. Exit codes: 0 done, 1 the work "
        "failed (or a check found a problem), 2 bad input or environment (a flag, file, location, "
        "credential or stack setting; one line names it), 130 interrupted.",
    )
    parser.top = True
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS,
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
        from runtime.trainer.stop import StopRequest  # before any import starts a thread

        StopRequest().install()
    parser = build_parser(command_of(raw))
    args = parser.parse_args(raw)
    if str(args.log_level).upper() not in LOG_LEVELS:  # a default from the environment
        parser.error(f"$ELASTIC_CTR_LOG_LEVEL {args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if str(args.log_level).upper() != "DEBUG":  # libraries' chatter: retries (the final error says
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # it all), where keys came from
        for name in ("botocore", "aiobotocore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"{args.command}: missing subcommand")
    from runtime import errors

    try:
        rc = handler(args)
    except KeyboardInterrupt as exc:  # SIGTERM to a launcher: its roles are stopped, exit 0
        from runtime.proc import Terminated

        return 0 if isinstance(exc, Terminated) else 130
    except Exception as exc:  # noqa: BLE001 - bad input: one line; anything else keeps its traceback
        if not errors.is_input_error(exc):
            raise
        logging.getLogger(__name__).debug("%s", getattr(args, "_prog", "elastic-ctr"), exc_info=True)
        print(f"{getattr(args, '_prog', 'elastic-ctr')}: error: {errors.one_line(exc)}", file=sys.stderr)
        return errors.BAD_INPUT
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
