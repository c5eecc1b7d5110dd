"""Subcommands of the trainer role: ``data generate`` and ``train``.

Heavy imports (Paddle) happen inside the handlers so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse

import logging
import os
import sys

from runtime.cli import HelpFormatter


#: rows ``data generate`` writes by default
GENERATE_ROWS = 100_000
GENERATE_TEST_ROWS = 20_000


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``TrainConfig`` field (``x_y`` -> ``--x-y``): type, choices, metavar and
    help (with the default) from the field. Flags default to None so that ``--config``
    values apply where a flag is not given."""
    from runtime.trainer import config
    from runtime.trainer.flags import flag

    for name, f in config.FIELDS.items():
        kind = config.base_type(f.annotation)
        kw = {"metavar": (f.json_schema_extra or {}).get("metavar"), "choices": config.choices(name)}
        if getattr(kind, "__origin__", None) is list:
            kw["nargs"] = "+"
        elif kind in (int, float):
            kw["type"] = kind
        shown = f.default
        if isinstance(shown, tuple):
            shown = ",".join(map(str, shown))
        help_text = f.description if shown in (None, []) else f"{f.description} (default: {shown})"
        parser.add_argument(flag(name), help=help_text, **{k: v for k, v in kw.items() if v is not None})


def register(sub: "argparse._SubParsersAction") -> None:
    """Adds ``data generate`` and ``train`` to the top-level parser."""
    data = sub.add_parser("data", formatter_class=HelpFormatter, help="training data utilities", description="Training data utilities.")
    dsub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    dsub.required = True
    gen = dsub.add_parser(
        "generate", formatter_class=HelpFormatter, help="generate Criteo-format data with a known learnable signal",
        description="Writes OUT/train.txt, OUT/test.txt (Criteo TSV) and OUT/signal.json; prints the AUC "
                    "the true logit reaches on the test split (the generator is documented in "
                    "runtime/trainer/generator.py).")
    gen.add_argument("--rows", type=int, default=GENERATE_ROWS, help="training rows")
    gen.add_argument("--test-rows", type=int, default=GENERATE_TEST_ROWS, help="test rows")
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--seed", type=int, default=1, help="random seed")
    gen.add_argument("--hours", "--partitions", dest="hours", type=int, default=0,
                     help="write this many partitions OUT/YYYYMMDD/HH/ (OUT/YYYYMMDD/HHMM/ with --partition-minutes "
                          "under 60; ROWS rows each, drifting hour to hour, _SUCCESS last) instead of train/test files")
    gen.add_argument("--partition-minutes", type=int, default=60,
                     help="with --hours: the partitions' period in minutes (60: hourly; 1..30 dividing 60: the "
                          "minute layout)")
    gen.add_argument("--start", default="20261120/00",
                     help="first partition of --hours, YYYYMMDD/HH (or YYYYMMDD/HHMM under an hour)")
    gen.add_argument("--every-seconds", type=float, default=0.0,
                     help="with --hours: seconds between two partitions (data landing while a job runs)")
    gen.add_argument("--shape", choices=("small", "long-tail"), default="small",
                     help="with --hours: vocabularies of ~22k feasigns in all (small, make demo's) or the production "
                          "shape: power-law slots, some with millions of values (long-tail; generator docstring)")
    gen.add_argument("--table-scale", type=float, default=1.0,
                     help="--shape long-tail: multiply the big slots' vocabularies by this (0.2: a 5x smaller table)")
    gen.add_argument("--extra-days", type=int, default=0,
                     help="also write train-day2.txt .. (ROWS rows each, same model): later days' "
                          "traffic for retraining rounds")
    gen.set_defaults(handler=_generate)

    tr = sub.add_parser(
        "train", formatter_class=HelpFormatter, help="parameter-server (or single-process) training and export",
        description="Fleet parameter-server CTR training (async). Without --local-cluster/--single the role "
                    "(pserver or trainer) comes from the environment: TRAINING_ROLE, "
                    "PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP, "
                    "PADDLE_PORT (or Volcano's VC_PSERVER_HOSTS, VC_TRAINER_NUM, VC_TASK_INDEX). "
                    "Trainer 0 exports the version to --output.")
    tr.add_argument("--config", help="YAML file with any of the options below (keys like the flags); flags win")
    _add_train_flags(tr)
    mode = tr.add_mutually_exclusive_group()
    mode.add_argument("--local-cluster", action="store_true",
                      help="start --pservers + --trainers processes on 127.0.0.1 and run the job")
    mode.add_argument("--single", action="store_true", help="single process, no parameter server")
    tr.add_argument("--pservers", type=int, default=1, help="--local-cluster: pservers")
    tr.add_argument("--trainers", type=int, default=2, help="--local-cluster: trainers")
    tr.add_argument("--log-dir", help="--local-cluster: directory for the roles' logs (default: a temp dir)")
    tr.add_argument("--timeout-seconds", type=float, help="--local-cluster: give up after this many seconds")
    tr.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI to log the job to (runtime/tracking.py); default: "
                         "$MLFLOW_TRACKING_URI; none: no tracking")
    tr.set_defaults(handler=_train)


def _setup_logging(level: str) -> None:
    """Our loggers print INFO lines even when an imported library (Paddle) configured the
    root logger first (``logging.basicConfig`` is then a no-op)."""
    lg = logging.getLogger("runtime")
    lg.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    if not lg.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        lg.addHandler(h)
        lg.propagate = False


def _generate(args) -> int:
    from runtime.trainer import generator

    if args.hours:
        _setup_logging(getattr(args, "log_level", "INFO"))
        try:
            rec = generator.generate_hours(args.out, args.hours, args.start, args.rows, args.seed, args.every_seconds,
                                           shape=args.shape, scale=args.table_scale, minutes=args.partition_minutes)
        except ValueError as exc:
            print(f"elastic-ctr data generate: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(rec.hours)} partitions of {rec.partition_minutes} minutes from {rec.start} under "
              f"{args.out} ({args.rows} rows each); true-logit AUC per partition: "
              + " ".join(f"{h.true_logit_auc:.4f}" for h in rec.hours))
        return 0
    rec = generator.generate(args.out, args.rows, args.test_rows, args.seed, extra_days=args.extra_days)
    print(f"wrote {args.out}: {', '.join(rec.files.values())}, signal.json in {rec.seconds} s "
          f"({rec.rows} train rows per day, {rec.test_rows} test rows)")
    print(f"true-logit test AUC: {rec.true_logit_auc_test:.4f} (click rate {rec.ctr_test:.3f})")
    return 0


def _summary_line(rec: dict) -> str:
    """The job's ``ELASTIC_CTR_SUMMARY`` line (``runtime.formats.train_result``)."""
    from runtime.formats.train_result import SUMMARY, TrainResult

    return TrainResult.of(rec).format(SUMMARY)


def _ps_role_exit(code: int) -> int:
    """Returns ``code``, except in a parameter-server role process whose Paddle PS runtime
    has started (``TRAINING_ROLE`` set, ``paddle.distributed`` imported) and failed (e.g.
    an export to a bucket that is gone): there the logs are flushed and the process ends
    at once with ``code`` (``os._exit``), so the clear error is its last output. Paddle
    3.0.0's PS client threads, still running, crash the interpreter's teardown with a
    segmentation fault and a C++ trace otherwise (measured: a trainer whose export
    upload failed)."""
    if os.environ.get("TRAINING_ROLE") and "paddle.distributed" in sys.modules:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _train(args) -> int:
    from runtime import proc, storage
    from runtime.trainer import config, input_checks, readers, roles, set_paddle_flags, train

    _setup_logging(getattr(args, "log_level", "INFO"))
    if args.tracking_uri:  # the roles (and --local-cluster's children) read it from the environment
        from runtime import tracking

        os.environ[tracking.URI_ENV] = args.tracking_uri
    try:
        cfg = config.config_from_args(args)
        input_checks.check_inputs(cfg)  # a bad flag or a missing file fails before anything starts
        if args.local_cluster:
            from runtime.local.ps import run_local_ps

            rec = run_local_ps(cfg, args.pservers, args.trainers, args.log_dir, args.timeout_seconds)
        else:
            set_paddle_flags()  # this process trains: before Paddle is imported
            rec = train.run_single(cfg) if args.single else train.run_role(cfg)
    except (ValueError, storage.LocationError, readers.TooManyBadLines, roles.RoleError) as exc:
        print(f"elastic-ctr train: error: {exc}", file=sys.stderr)
        return _ps_role_exit(2)
    except proc.RoleFailed as exc:
        print(f"elastic-ctr train: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a failed pass or export: the message says which and why
        logging.getLogger("runtime.trainer").error("%s", exc)
        print(f"elastic-ctr train: failed: {exc}", file=sys.stderr)
        return _ps_role_exit(1)
    if rec and (args.local_cluster or args.single):
        auc = rec.get("test_auc") or []
        if rec.get("mode_online"):
            ex = rec.get("exports") or []
            print(f"{rec.get('mode')} continuous training stopped before {rec.get('next_hour')}: "
                  f"{len(rec.get('partitions') or [])} partition(s), "
                  f"{sum(e['kind'] == 'base' for e in ex)} base(s) and {sum(e['kind'] == 'patch' for e in ex)} "
                  f"patch(es) exported; AUC before training on each partition {[round(a, 4) for a in auc]}")
            print(_summary_line(rec))
            return 0
        print(f"{rec.get('mode')} training done: test auc per pass {[round(a, 4) for a in auc]}, "
              f"{rec.get('examples_per_s_total') or rec.get('examples_per_s')} examples/s"
              + (f", version {rec['version']} exported to {cfg.output}" if rec.get("version") else ""))
        print(_summary_line(rec))
    return 0
