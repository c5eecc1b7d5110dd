"""The local pipeline (``elastic-ctr local``, what ``make demo`` runs). Work in progress."""
from __future__ import annotations

DESCRIPTION = "Runs the whole pipeline locally as processes on 127.0.0.1."


def add_arguments(p) -> None:
    """Adds the local pipeline's flags to ``p``."""


def main(args) -> int:
    raise SystemExit("elastic-ctr local: not implemented yet")
