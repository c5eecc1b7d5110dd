"""Entry point Pulumi runs (``main: infra/`` in Pulumi.yaml): declare, then export."""
from __future__ import annotations

import sys
from pathlib import Path

# `pulumi up` runs this file with infra/ on sys.path; the packages live at the repo root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402

from infra.program import build  # noqa: E402

for _name, _value in build().items():
    pulumi.export(_name, _value)
