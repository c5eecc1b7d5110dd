"""``elastic-ctr schema infer``: writes the data schema (``runtime.formats.data_schema``)
from partitions of the project's own data, for review beside the stack (``schemas/ctr.yaml``);
``elastic-ctr schema check``: judges partitions against a schema, as the data gate's schema
checks do (``runtime.trainer.data_gate.check_schema``), printing each anomaly."""
from __future__ import annotations

import argparse
import sys

from runtime.cli import HelpFormatter


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``schema infer`` and ``schema check`` to the top-level parser."""
    p = sub.add_parser("schema", formatter_class=HelpFormatter, help="the data gate's schema of the partitions",
                       description="Infer the data schema from normal partitions, or check partitions against it "
                                   "(runtime/formats/data_schema.py).")
    ssub = p.add_subparsers(dest="schema_command", metavar="COMMAND")
    ssub.required = True
    for name, helptext in (("infer", "write a schema from normal partitions"),
                           ("check", "check partitions against a schema; exit 1 if any breaks it")):
        c = ssub.add_parser(name, formatter_class=HelpFormatter, help=helptext, description=helptext + ".")
        c.add_argument("--data-root", required=True, help="partition root ROOT/YYYYMMDD/HH/ (path or URL)")
        c.add_argument("--start-hour", required=True, help="first partition, YYYYMMDD/HH")
        c.add_argument("--end-hour", required=True, help="last partition (included), YYYYMMDD/HH")
        c.add_argument("--format", default="criteo", choices=("criteo", "slot"), help="input format")
        c.add_argument("--slot-file", help="slot list for --format slot (default 1..26)")
        c.add_argument("--limit", type=int, default=100_000, help="rows read per partition at most")
        if name == "infer":
            c.add_argument("--out", required=True, help="the schema file to write (YAML)")
            c.add_argument("--margin", type=float, default=0.5,
                           help="bounds = the observed extremes widened by this fraction (and at least --floor)")
            c.add_argument("--floor", type=float, default=0.05, help="smallest widening of a bound (absolute)")
        else:
            c.add_argument("--schema", required=True, help="the schema file (YAML, path or URL)")
        c.set_defaults(handler=_infer if name == "infer" else _check)


def _stats(args):
    from runtime import storage
    from runtime.formats import features, partitions
    from runtime.trainer import data_gate, readers

    slots = (features.load_slots(storage.read_bytes(args.slot_file).decode()) if args.slot_file
             else features.DEFAULT_SLOTS)
    hours = partitions.hours(partitions.Hour.parse(args.start_hour, "--start-hour"),
                             partitions.Hour.parse(args.end_hour, "--end-hour"))
    if not hours:
        raise ValueError("--end-hour is before --start-hour")
    out = []
    for h in hours:
        b = readers.read_all(partitions.files(args.data_root, h), args.format, slots, limit=args.limit)
        out.append(data_gate.statistics(str(h), b.labels, b.dense, b.feasigns, slots))
    return slots, out


def _infer(args) -> int:
    from runtime.formats import data_schema

    slots, stats = _stats(args)
    schema = data_schema.infer(stats, args.format, slots, margin=args.margin, floor=args.floor)
    with open(args.out, "w") as f:
        f.write(schema.to_yaml())
    print(f"wrote {args.out} from {len(stats)} partition(s) of {args.data_root}")
    return 0


def _check(args) -> int:
    from runtime.formats import data_schema
    from runtime.trainer import data_gate

    schema = data_schema.load(args.schema)
    slots, stats = _stats(args)
    schema.check_job(args.format, slots, f"--schema {args.schema}")
    bad = 0
    for st in stats:
        anomalies = data_gate.check_schema(st, schema)
        bad += bool(anomalies)
        print(f"{st.hour}: " + ("ok" if not anomalies else "; ".join(a.message for a in anomalies)))
    print(f"{bad} of {len(stats)} partition(s) break {args.schema}", file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0
