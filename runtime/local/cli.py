"""``elastic-ctr local``: the whole pipeline as processes on this machine."""
from __future__ import annotations

import argparse

from runtime.cli import RawDescriptionHelpFormatter


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``local`` to the top-level parser."""
    from runtime.local import pipeline  # light: argparse flags and the docstring only

    p = sub.add_parser("local", help="run the whole pipeline locally as processes (what `make demo` runs)",
                       description=pipeline.DESCRIPTION, formatter_class=RawDescriptionHelpFormatter)
    pipeline.add_arguments(p)
    p.set_defaults(handler=lambda args: pipeline.main(args))
