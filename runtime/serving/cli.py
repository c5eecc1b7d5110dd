"""Subcommands of this role (registered into ``elastic-ctr``); filled in by the role's issue."""
from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds this role's subcommands to the top-level parser."""
