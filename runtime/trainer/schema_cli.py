"""``elastic-ctr schema infer``: writes the data schema (``runtime.formats.data_schema``)
from partitions of the project's own data, for review beside the stack (``schemas/ctr.yaml``);
``elastic-ctr schema check``: judges partitions against a schema, as the data gate's schema
checks do (``runtime.trainer.gate_checks.check_schema``), printing each anomaly;
``elastic-ctr schema drift``: replays partitions through the data gate's bounds against the
recent partitions as a continuous job does (its window of accepted partitions, its
new-feasign sketch; ``runtime.trainer.gate_checks.check_history``), printing each partition's
largest distances beside the bounds: how far normal data is from quarantine, the figures
the defaults are chosen from."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from runtime.cli import HelpFormatter
from runtime.errors import InputError


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``schema infer`` and ``schema check`` to the top-level parser."""
    p = sub.add_parser("schema", formatter_class=HelpFormatter, help="the data gate's schema of the partitions",
                       description="Infer the data schema from normal partitions, or check partitions against it "
                                   "(runtime/formats/data_schema.py).")
    ssub = p.add_subparsers(dest="schema_command", metavar="COMMAND")
    ssub.required = True
    for name, helptext in (("infer", "write a schema from normal partitions"),
                           ("check", "check partitions against a schema; exit 1 if any breaks it"),
                           ("drift", "replay partitions through the data gate's bounds against the recent ones, as "
                                     "a continuous job does; print each one's largest distances; exit 1 if any "
                                     "would be quarantined")):
        c = ssub.add_parser(name, formatter_class=HelpFormatter, help=helptext, description=helptext + ".")
        c.add_argument("--data-root", required=True, help="partition root ROOT/YYYYMMDD/HH/ (path or URL)")
        c.add_argument("--start-hour", required=True, help="first partition, YYYYMMDD/HH (YYYYMMDD/HHMM under an "
                       "hour)")
        c.add_argument("--end-hour", required=True, help="last partition (included), as --start-hour")
        c.add_argument("--partition-minutes", type=int, default=60, help="the partitions' period in minutes")
        c.add_argument("--format", default="criteo", choices=("criteo", "slot"), help="input format")
        c.add_argument("--slot-file", help="slot list for --format slot (default 1..26)")
        c.add_argument("--limit", type=int, default=100_000 if name != "drift" else None,
                       help="rows read per partition at most" + ("" if name != "drift" else " (default: all)"))
        if name == "drift":
            c.add_argument("--shard", default="0/2", help="I/N: read the lines I mod N, trainer I's shard of a job "
                           "of N trainers (the gate measures trainer 0's)")
            from runtime.trainer.gate_config import DEFAULTS

            for key in DEFAULTS:
                if key not in ("data_schema", "gate_eval_every", "gate_eval_rows"):
                    c.add_argument("--" + key.replace("_", "-"), type=type(DEFAULTS[key]), default=DEFAULTS[key],
                                   help=f"as train's (default {DEFAULTS[key]})")
        if name == "infer":
            c.add_argument("--out", required=True, help="the schema file to write (YAML)")
            c.add_argument("--margin", type=float, default=0.5,
                           help="bounds = the observed extremes widened by this fraction (and at least --floor)")
            c.add_argument("--floor", type=float, default=0.05, help="smallest widening of a bound (absolute)")
        elif name == "check":
            c.add_argument("--schema", required=True, help="the schema file (YAML, path or URL)")
        c.set_defaults(handler={"infer": _infer, "check": _check, "drift": _drift}[name])


def _read(args):
    """The slots, and a generator of ``(partition name, readers.Batch)`` over the span."""
    from runtime import storage
    from runtime.formats import features, partitions
    from runtime.trainer import readers

    slots = (features.load_slots(storage.read_bytes(args.slot_file).decode()) if args.slot_file
             else features.DEFAULT_SLOTS)
    m = args.partition_minutes
    span = partitions.span(partitions.Partition.parse(args.start_hour, "--start-hour", m),
                           partitions.Partition.parse(args.end_hour, "--end-hour", m))
    if not span:
        raise InputError(f"--end-hour {args.end_hour} is before --start-hour {args.start_hour}")
    try:
        i, n = (int(x) for x in getattr(args, "shard", "0/1").split("/"))
    except ValueError:
        raise InputError(f"--shard {args.shard!r}: expected I/N, e.g. 0/2") from None

    def batches():
        for h in span:
            parts = list(readers.iter_batches(partitions.files(args.data_root, h), args.format, 65536, slots,
                                              shard=(i, n)))
            if not parts:
                raise InputError(f"partition {h}: no valid rows in shard {i}/{n}")
            b = readers.Batch(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("labels", "dense",
                                                                                          "feasigns")))
            if args.limit is not None:
                b = readers.Batch(b.labels[:args.limit], b.dense[:args.limit], b.feasigns[:args.limit])
            yield str(h), b

    return slots, batches()


def _stats(args):
    from runtime.trainer import data_gate

    slots, batches = _read(args)
    return slots, [data_gate.statistics(h, b.labels, b.dense, b.feasigns, slots) for h, b in batches]


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
    from runtime.trainer import gate_checks

    from runtime import storage

    try:
        schema = data_schema.load(args.schema)
    except storage.LocationError as exc:  # the file, not the partitions: name the flag
        raise type(exc)(f"--schema {exc}") from None
    slots, stats = _stats(args)
    schema.check_job(args.format, slots, f"--schema {args.schema}")
    bad = 0
    for st in stats:
        anomalies = gate_checks.check_schema(st, schema)
        bad += bool(anomalies)
        print(f"{st.hour}: " + ("ok" if not anomalies else "; ".join(a.message for a in anomalies)))
    print(f"{bad} of {len(stats)} partition(s) break {args.schema}", file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0


def _drift(args) -> int:
    """Replays the span through a window of accepted partitions and a feasign sketch, as
    ``data_gate.DataGate`` does (a quarantined partition stays out of both; no lasting-shift
    adaptation, no served model): per partition its rows, the largest L-infinity distance
    of a slot's top values, the largest fall of a slot's distinct values (the smaller of
    count and per row, as the bound reads them), the largest dense Jensen-Shannon distance,
    the new-feasign rate and the anomalies; then each distance's largest over the span and
    the median milliseconds the gate's statistics took per partition (``statistics_ms``:
    all of them, as the job measures the shard; ``categorical_ms``: the categorical ones,
    ``partition_stats.categorical``, again alone)."""
    import dataclasses
    import statistics as pystats
    import time

    from runtime.formats import features

    from runtime.formats import partition_stats as ps
    from runtime.trainer import data_gate, gate_checks

    th = gate_checks.Thresholds(**{f.name: getattr(args, "gate_" + f.name)
                                   for f in dataclasses.fields(gate_checks.Thresholds)})
    slots, batches = _read(args)
    names = [f"C{s}" for s in slots]
    hist, sketch = ps.GateHistory(), data_gate.FeasignSketch()
    worst: dict[str, tuple[float, str]] = {}
    bad = 0
    ms: dict[str, list[float]] = {"statistics_ms": [], "categorical_ms": []}
    miss = features.missing_feasign(np.asarray(slots))
    print(f"{'partition':>14} {'rows':>8} {'linf':>6} {'slot':>4} {'distinct fall':>13} {'slot':>4} {'dense js':>8} "
          f"{'new fs':>6}  anomalies")
    for h, b in batches:
        t0 = time.perf_counter()
        st = data_gate.statistics(h, b.labels, b.dense, b.feasigns, slots, sketch, th.window)
        t1 = time.perf_counter()
        ps.categorical(b.feasigns, miss)
        ms["statistics_ms"].append((t1 - t0) * 1000)
        ms["categorical_ms"].append((time.perf_counter() - t1) * 1000)
        recent = hist.accepted
        linf, fall, js = (0.0, ""), (1.0, ""), 0.0
        if len(recent) >= th.min_history:
            for j, name in enumerate(names):
                if st.categorical_rows * (1 - st.missing_rate[j]) >= gate_checks.MIN_PRESENT:
                    d = ps.linf_distance(st.top_values[j], [s.top_values[j] for s in recent])
                    ref = pystats.median([s.distinct[j] for s in recent])
                    per_row = pystats.median([s.distinct[j] / s.categorical_rows for s in recent])
                    f = min(ref / max(st.distinct[j], 1),
                            per_row / max(st.distinct[j], 1) * st.categorical_rows)
                    linf, fall = max(linf, (d, name)), max(fall, (f, name))
            js = max(ps.js_distance(np.asarray(st.dense_hist[i]), np.mean([s.dense_hist[i] for s in recent], axis=0))
                     for i in range(len(st.dense_hist)))
        an = gate_checks.check_history(st, recent, th, names)
        bad += bool(an)
        for key, v in (("linf", linf[0]), ("distinct_fall", fall[0]), ("dense_js", js),
                       ("new_feasign_rate", st.new_feasign_rate or 0.0)):
            if v > worst.get(key, (-1.0, ""))[0]:
                worst[key] = (v, h)
        rate = "-" if st.new_feasign_rate is None else f"{st.new_feasign_rate:.3f}"
        print(f"{h:>14} {st.rows:>8} {linf[0]:>6.3f} {linf[1]:>4} {fall[0]:>13.2f} {fall[1]:>4} {js:>8.3f} "
              f"{rate:>6}  " + ("; ".join(a.message for a in an) or "ok"), flush=True)
        if not an:
            hist.accept(st, th.window)
            sketch.add(data_gate.present_keys(b.feasigns, slots))
    print("drift " + " ".join(f"{k}_max={v:.3f} ({h})" for k, (v, h) in worst.items())
          + "".join(f" {k}_p50={pystats.median(v):.1f}" for k, v in ms.items() if v)
          + f" quarantined={bad} bounds: categorical_linf={th.categorical_linf:g} "
            f"distinct_ratio={th.distinct_ratio:g} dense_js={th.dense_js:g}")
    return 1 if bad else 0
