"""``elastic-ctr local --break-hour N --break labels|feature|categorical``: the online demo corrupts
partition N (0-based, the base's is 0) as it lands, as a broken upstream job would, so that
the data gate's quarantine shows in the run (``runtime.trainer.data_gate``):

* ``labels``: every label flipped (a logging bug);
* ``feature``: slot C3 empty in every row (a join that lost a column's values);
* ``categorical``: slot C3 one value (``DEFAULT_VALUE``) in every row (a join that fell
  back to a default): no missing-rate, row, click-rate or dense bound moves, the
  categorical bounds do.

The statistics are compared once ``MIN_BEFORE`` partitions were accepted (the trainer's
``--gate-min-history`` default), so N is at least that and before the last hour.
"""
from __future__ import annotations

from pathlib import Path

KINDS = ("labels", "feature", "categorical")
DEFAULT_VALUE = "00000000"
MIN_BEFORE = 3
SLOT_FIELD = 1 + 13 + 2  # C3 in a Criteo line: label, I1..I13, C1, C2, C3


def add_arguments(p) -> None:
    """``--break-hour`` and ``--break`` (module docstring)."""
    p.add_argument("--break-hour", type=int, default=None, metavar="N",
                   help=f"online: corrupt partition N (0-based, {MIN_BEFORE}..hours-1) as it lands; the data gate "
                        "quarantines it (docs/safe-online.md)")
    p.add_argument("--break", dest="break_kind", choices=KINDS, default="labels",
                   help="online, with --break-hour: flip every label, empty slot C3 in every row, or set it "
                        "to one value in every row")


def check(args, hours: int) -> None:
    """Raises ``ValueError`` naming ``--break-hour`` when it is out of range."""
    n = getattr(args, "break_hour", None)
    if n is not None and not MIN_BEFORE <= n < hours:
        raise ValueError(f"--break-hour {n}: expected {MIN_BEFORE}..{hours - 1} (the data gate compares a partition "
                         f"with {MIN_BEFORE} accepted ones first; --hours {hours})")


def corrupt(partition: Path, kind: str) -> int:
    """Rewrites the data files of a local partition directory (not ``_``/``.`` files) in
    place, corrupted by ``kind``; returns the lines rewritten."""
    n = 0
    for f in sorted(partition.iterdir()):
        if f.name.startswith(("_", ".")) or not f.is_file():
            continue
        out = []
        for line in f.read_text().splitlines():
            fields = line.split("\t")
            if kind == "labels":
                fields[0] = "1" if fields[0] == "0" else "0"
            else:
                fields[SLOT_FIELD] = "" if kind == "feature" else DEFAULT_VALUE
            out.append("\t".join(fields))
            n += 1
        f.write_text("\n".join(out) + "\n")
    return n
