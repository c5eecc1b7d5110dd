"""Subcommands of the trainer role: ``data generate`` and ``train``.

Heavy imports (Paddle) happen inside the handlers so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse

import json
import logging
import sys

from runtime.cli import HelpFormatter


#: rows ``data generate`` writes by default
GENERATE_ROWS = 100_000
GENERATE_TEST_ROWS = 20_000


def _with_default(help_text: str, field: str) -> str:
    """``help_text`` plus the training default of ``field`` (``TrainConfig``: flags default
    to None so that ``--config`` values apply where a flag is not given)."""
    from runtime.trainer.config import TrainConfig

    value = getattr(TrainConfig(), field)
    if value is None or value == []:
        return help_text
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
    return f"{help_text} (default: {shown})"


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
    gen.add_argument("--hours", type=int, default=0,
                     help="write hourly partitions OUT/YYYYMMDD/HH/ (ROWS rows each, drifting hour to hour, "
                          "_SUCCESS last) instead of train/test files")
    gen.add_argument("--start", default="20261120/00", help="first hour of --hours, YYYYMMDD/HH")
    gen.add_argument("--every-s", type=float, default=0.0,
                     help="with --hours: seconds between two hours (data landing while a job runs)")
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
    tr.add_argument("--data-train", nargs="+", metavar="LOC", help="training data: paths, globs, dirs or URLs")
    tr.add_argument("--data-test", nargs="+", metavar="LOC", help="test data (test AUC after each pass)")
    tr.add_argument("--format", choices=("criteo", "slot"), help=_with_default("input format", "format"))
    tr.add_argument("--slot-file", help="slot list for --format slot (one slot id per line; default 1..26)")
    tr.add_argument("--epochs", type=int, help=_with_default("passes over the training data", "epochs"))
    tr.add_argument("--batch-size", type=int, help=_with_default("examples per batch per trainer", "batch_size"))
    tr.add_argument("--lr", type=float, help=_with_default("Adam learning rate", "lr"))
    tr.add_argument("--embedding-dim", type=int, help=_with_default("embedding width", "embedding_dim"))
    tr.add_argument("--layers", help=_with_default("hidden layer widths, comma-separated", "layers"))
    tr.add_argument("--sparse-shards", type=int, help=_with_default("sparse table shard_num", "sparse_shards"))
    tr.add_argument("--output", help="version root: a directory or the file server's URL (export if set)")
    tr.add_argument("--upload-token-file", help="file holding the upload token (else $ELASTIC_CTR_UPLOAD_TOKEN)")
    tr.add_argument("--max-bad-lines", type=int, help=_with_default("malformed lines allowed before training stops", "max_bad_lines"))
    tr.add_argument("--max-bad-fraction", type=float, help="malformed fraction allowed (default: not checked)")
    tr.add_argument("--log-every-s", type=float, help=_with_default("seconds between progress lines", "log_every_s"))
    tr.add_argument("--test-limit", type=int, help="evaluate on at most this many test rows")
    tr.add_argument("--single-vocab-size", type=int, help=_with_default("--single: embedding rows", "single_vocab_size"))
    tr.add_argument("--dump-predictions", help="save trainer 0's final test predictions (.npy) here")
    tr.add_argument("--seed", type=int, help=_with_default("random seed of the initializers", "seed"))
    tr.add_argument("--wait-pserver-s", type=float, help=_with_default("seconds a trainer waits for the pservers", "wait_pserver_s"))
    tr.add_argument("--table-dir", metavar="DIR",
                    help="base directory of the sparse-table save at export: the pservers write the table "
                         "into a fresh subdirectory of DIR on their own file system, trainer 0 reads it "
                         "back, then removes it (default: the system temp dir). In Kubernetes DIR must be "
                         "a volume shared by the pserver and trainer pods (ReadWriteMany), mounted at the "
                         "same path")
    tr.add_argument("--threads", type=int,
                    help=_with_default("dataset threads per trainer (train_from_dataset thread_num); the "
                                       "trainer's shard is staged as this many files", "threads"))
    tr.add_argument("--ps-mode", choices=("async", "async-merged", "geo"),
                    help=_with_default("parameter-server flavour: async = every batch's gradients pushed as "
                                       "they are; async-merged = Paddle's client defaults (up to 13 batches "
                                       "summed into one push); geo = GEO-SGD, each trainer trains a local "
                                       "hashed table and exchanges deltas every --geo-k-steps batches (batch "
                                       "mode only). Measured figures: docs/training.md", "ps_mode"))
    tr.add_argument("--geo-k-steps", type=int, help=_with_default("--ps-mode geo: batches between exchanges",
                                                                  "geo_k_steps"))
    tr.add_argument("--geo-table-rows", type=int,
                    help=_with_default("--ps-mode geo: rows of the hashed table (feasign -> 1 + feasign mod "
                                       "(rows - 1))", "geo_table_rows"))
    tr.add_argument("--work-dir", metavar="DIR",
                    help="where the trainer stages its shard as MultiSlot files before Paddle loads them "
                         "(removed once loaded; default: the system temp dir)")
    tr.add_argument("--mode", choices=("batch", "continuous"),
                    help=_with_default("batch: --epochs passes over the training data, one base version; "
                                       "continuous: hourly partitions of --data-root in order, each once, a "
                                       "patch version every --patch-every and a base every --base-every",
                                       "mode"))
    tr.add_argument("--data-root", metavar="ROOT",
                    help="hourly partitions ROOT/YYYYMMDD/HH/ (a directory or the file server's URL); a "
                         "partition is read once its _SUCCESS marker exists")
    tr.add_argument("--start-hour", metavar="YYYYMMDD/HH", help="first partition of --data-root")
    tr.add_argument("--end-hour", metavar="YYYYMMDD/HH",
                    help="last partition (included); continuous mode without it follows the data")
    tr.add_argument("--poll-s", type=float,
                    help=_with_default("continuous: seconds between looks for the next partition", "poll_s"))
    tr.add_argument("--patch-every", type=int,
                    help=_with_default("continuous: partitions per exported version", "patch_every"))
    tr.add_argument("--base-every", type=int,
                    help=_with_default("continuous: partitions per base version (the others are patches)",
                                       "base_every"))
    tr.add_argument("--state-dir", metavar="DIR",
                    help="continuous: the state file and checkpoints a restarted job resumes from (in "
                         "Kubernetes a volume shared by every pod of the job)")
    mode = tr.add_mutually_exclusive_group()
    mode.add_argument("--local-cluster", action="store_true",
                      help="start --pservers + --trainers processes on 127.0.0.1 and run the job")
    mode.add_argument("--single", action="store_true", help="single process, no parameter server")
    tr.add_argument("--pservers", type=int, default=1, help="--local-cluster: pservers")
    tr.add_argument("--trainers", type=int, default=2, help="--local-cluster: trainers")
    tr.add_argument("--log-dir", help="--local-cluster: directory for the roles' logs (default: a temp dir)")
    tr.add_argument("--timeout-s", type=float, help="--local-cluster: give up after this many seconds")
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
            rec = generator.generate_hours(args.out, args.hours, args.start, args.rows, args.seed, args.every_s)
        except ValueError as exc:
            print(f"elastic-ctr data generate: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(rec['hours'])} hourly partitions from {rec['start']} under {args.out} "
              f"({args.rows} rows each); true-logit AUC per hour: "
              + " ".join(f"{h['true_logit_auc']:.4f}" for h in rec["hours"]))
        return 0
    rec = generator.generate(args.out, args.rows, args.test_rows, args.seed, extra_days=args.extra_days)
    print(f"wrote {args.out}: {', '.join(rec['files'].values())}, signal.json in {rec['seconds']} s "
          f"({rec['rows']} train rows per day, {rec['test_rows']} test rows)")
    print(f"true-logit test AUC: {rec['true_logit_auc_test']:.4f} (click rate {rec['ctr_test']:.3f})")
    return 0


def _train(args) -> int:
    from runtime import proc, storage
    from runtime.trainer import config, readers, roles, set_paddle_flags, train

    _setup_logging(getattr(args, "log_level", "INFO"))
    try:
        cfg = config.config_from_args(args)
        config.check_inputs(cfg)  # a bad flag or a missing file fails before anything starts
        if args.local_cluster:
            from runtime.trainer.cluster import run_local_cluster

            rec = run_local_cluster(cfg, args.pservers, args.trainers, args.log_dir, args.timeout_s)
        else:
            set_paddle_flags()  # this process trains: before Paddle is imported
            rec = train.run_single(cfg) if args.single else train.run_role(cfg)
    except (ValueError, storage.LocationError, readers.TooManyBadLines, roles.RoleError) as exc:
        print(f"elastic-ctr train: error: {exc}", file=sys.stderr)
        return 2
    except proc.RoleFailed as exc:
        print(f"elastic-ctr train: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a failed pass or export: the message says which and why
        logging.getLogger("runtime.trainer").error("%s", exc)
        print(f"elastic-ctr train: failed: {exc}", file=sys.stderr)
        return 1
    if rec and (args.local_cluster or args.single):
        auc = rec.get("test_auc") or []
        if rec.get("mode_online"):
            ex = rec.get("exports") or []
            print(f"{rec.get('mode')} continuous training stopped before {rec.get('next_hour')}: "
                  f"{len(rec.get('partitions') or [])} partition(s), "
                  f"{sum(e['kind'] == 'base' for e in ex)} base(s) and {sum(e['kind'] == 'patch' for e in ex)} "
                  f"patch(es) exported; AUC before training on each partition {[round(a, 4) for a in auc]}")
            print("ELASTIC_CTR_SUMMARY " + json.dumps(rec))
            return 0
        print(f"{rec.get('mode')} training done: test auc per pass {[round(a, 4) for a in auc]}, "
              f"{rec.get('examples_per_s_total') or rec.get('examples_per_s')} examples/s"
              + (f", version {rec['version']} exported to {cfg.output}" if rec.get("version") else ""))
        print("ELASTIC_CTR_SUMMARY " + json.dumps(rec))
    return 0
