"""The training settings: ``TrainConfig`` (flags, or ``--config`` YAML keys), its checks,
and the flags that reproduce it for a child process. Imports no Paddle, so the local
pipeline, the Pulumi program and the CLI's ``--help`` can read the defaults."""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field

from runtime.formats import features
from runtime.trainer import readers


@dataclass
class TrainConfig:
    """Everything ``train`` needs (flags or ``--config`` YAML keys with ``_`` for ``-``)."""

    data_train: list = field(default_factory=list)
    data_test: list = field(default_factory=list)
    format: str = "criteo"
    slot_file: str | None = None
    epochs: int = 2
    batch_size: int = 512
    lr: float = 0.002
    embedding_dim: int = 9
    layers: tuple = (128, 64, 32)
    sparse_shards: int = 8
    output: str | None = None
    upload_token_file: str | None = None
    max_bad_lines: int | None = 100
    max_bad_fraction: float | None = None
    log_every_s: float = 5.0
    test_limit: int | None = None
    single_vocab_size: int = 1 << 20
    dump_predictions: str | None = None
    seed: int = 1
    wait_pserver_s: float = 120.0
    table_dir: str | None = None
    threads: int = 1
    work_dir: str | None = None
    ps_mode: str = "async"
    geo_k_steps: int = 100
    geo_table_rows: int = 1 << 20
    mode: str = "batch"
    data_root: str | None = None
    start_hour: str | None = None
    end_hour: str | None = None
    poll_s: float = 30.0
    patch_every: int = 1
    base_every: int = 24
    state_dir: str | None = None

    def slots(self) -> tuple[int, ...]:
        """The slot list (from ``slot_file`` for the slot format, else 1..26)."""
        if self.format == "slot" and self.slot_file:
            from runtime import storage

            return features.load_slots(storage.read_bytes(self.slot_file).decode())
        return features.DEFAULT_SLOTS


MODES = ("batch", "continuous")
#: the parameter-server flavours (runtime.trainer.worker.strategy)
PS_MODES = ("async", "async-merged", "geo")


def check_inputs(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """Resolves train and test locations; raises ``storage.LocationError`` naming a missing
    file or unreachable URL, ``ValueError`` (``PartitionError``) for bad settings. Call
    before starting anything.

    Training data is ``--data-train`` (files, globs, URLs), or ``--data-root`` with
    ``--start-hour`` [``--end-hour``]: in batch mode every partition of the range, each of
    which must be complete; in continuous mode the partitions are found as they land
    (``runtime.trainer.online``), so the train list returned is empty."""
    from runtime.formats import partitions

    if cfg.mode not in MODES:
        raise ValueError(f"--mode {cfg.mode!r}: expected one of {', '.join(MODES)}")
    if cfg.format not in ("criteo", "slot"):
        raise ValueError(f"--format {cfg.format!r}: expected criteo or slot")
    if cfg.ps_mode not in PS_MODES:
        raise ValueError(f"--ps-mode {cfg.ps_mode!r}: expected one of {', '.join(PS_MODES)}")
    if cfg.ps_mode == "geo" and cfg.mode == "continuous":
        raise ValueError("--ps-mode geo: continuous training needs the parameter server's own sparse table "
                         "(patch saves, resume); use --ps-mode async")
    if cfg.geo_table_rows < 2:
        raise ValueError(f"--geo-table-rows must be >= 2 (got {cfg.geo_table_rows})")
    for name in ("epochs", "batch_size", "embedding_dim", "sparse_shards", "threads", "patch_every",
                 "base_every", "geo_k_steps"):
        if int(getattr(cfg, name)) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    if cfg.poll_s <= 0:
        raise ValueError(f"--poll-s must be > 0 (got {cfg.poll_s})")
    if cfg.data_root and cfg.data_train:
        raise ValueError("--data-train and --data-root: give one of them")
    start = end = None
    if cfg.data_root:
        if not cfg.start_hour:
            raise ValueError("--data-root needs --start-hour YYYYMMDD/HH")
        start = partitions.Hour.parse(cfg.start_hour, "--start-hour")
        if cfg.end_hour:
            end = partitions.Hour.parse(cfg.end_hour, "--end-hour")
            if end < start:
                raise ValueError(f"--end-hour {end} is before --start-hour {start}")
    elif cfg.start_hour or cfg.end_hour:
        raise ValueError("--start-hour/--end-hour need --data-root (a partitioned layout)")
    if cfg.mode == "continuous":
        if not cfg.data_root:
            raise ValueError("--mode continuous needs --data-root ROOT (hourly partitions ROOT/YYYYMMDD/HH)")
        if not cfg.state_dir:
            raise ValueError("--mode continuous needs --state-dir DIR (the state file and checkpoints that "
                             "a restarted job resumes from; in Kubernetes a volume shared by every pod)")
        if "://" in str(cfg.state_dir):
            raise ValueError(f"--state-dir {cfg.state_dir}: expected a local directory, not a URL")
        if cfg.patch_every > cfg.base_every:
            raise ValueError(f"--patch-every {cfg.patch_every} is larger than --base-every {cfg.base_every}")
    elif not cfg.data_train and not cfg.data_root:
        raise ValueError("--data-train: no training data given (or --data-root with --start-hour/--end-hour)")
    if cfg.lr <= 0:
        raise ValueError(f"--lr must be > 0 (got {cfg.lr})")
    if not cfg.layers or any(int(x) < 1 for x in cfg.layers):
        raise ValueError(f"--layers: positive widths expected (got {cfg.layers})")
    if cfg.mode == "continuous":
        train = []
    elif cfg.data_root:
        if end is None:
            raise ValueError("--data-root in batch mode needs --end-hour (continuous mode follows the data)")
        train = [f for h in partitions.hours(start, end) for f in partitions.files(cfg.data_root, h)]
    else:
        train = readers.resolve(cfg.data_train)
    test = readers.resolve(cfg.data_test) if cfg.data_test else []
    if cfg.slot_file:
        from runtime import storage

        storage.check_readable(cfg.slot_file)
    if cfg.table_dir:
        check_table_dir(cfg.table_dir)
    if cfg.work_dir:
        if "://" in str(cfg.work_dir):
            raise ValueError(f"--work-dir {cfg.work_dir}: expected a local directory, not a URL")
        try:
            os.makedirs(cfg.work_dir, exist_ok=True)
            os.rmdir(tempfile.mkdtemp(prefix="elastic-ctr-check-", dir=cfg.work_dir))
        except OSError as exc:
            raise ValueError(f"--work-dir {cfg.work_dir}: cannot create a directory in it ({exc})") from None
    return train, test



TABLE_DIR_PREFIX = "elastic-ctr-table-"


def check_table_dir(base: str) -> None:
    """Creates ``base`` (the ``--table-dir``) if missing and checks that a subdirectory can
    be made in it, so a bad value fails before training rather than at the export.

    Raises ``ValueError`` naming the flag for a URL or a directory that cannot be created
    or written."""
    if "://" in str(base):
        raise ValueError(f"--table-dir {base}: expected a local directory (in Kubernetes a volume "
                         "shared by the pserver and trainer pods), not a URL")
    try:
        os.makedirs(base, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=TABLE_DIR_PREFIX + "check-", dir=base))
    except OSError as exc:
        raise ValueError(f"--table-dir {base}: cannot create a directory in it ({exc})") from None


def config_from_args(args) -> TrainConfig:
    """Merges ``--config FILE`` (YAML mapping; keys like the flags, ``-`` or ``_``) with
    flags given on the command line (flags win). Raises ``ValueError`` on unknown keys."""
    cfg = TrainConfig()
    if getattr(args, "config", None):
        import yaml

        from runtime import storage

        data = yaml.safe_load(storage.read_bytes(args.config)) or {}
        if not isinstance(data, dict):
            raise ValueError(f"--config {args.config}: expected a YAML mapping")
        known = set(asdict(cfg))
        for k, v in data.items():
            key = str(k).replace("-", "_")
            if key not in known:
                raise ValueError(f"--config {args.config}: unknown key {k!r} (known: {sorted(known)})")
            setattr(cfg, key, v)
    for k in asdict(cfg):
        v = getattr(args, k, None)
        if v is not None:
            setattr(cfg, k, v)
    if isinstance(cfg.layers, str):
        cfg.layers = parse_layers(cfg.layers)
    cfg.layers = tuple(int(x) for x in cfg.layers)
    for k in ("data_train", "data_test"):
        v = getattr(cfg, k)
        if isinstance(v, str):
            setattr(cfg, k, [v])
    return cfg


def parse_layers(text: str) -> tuple[int, ...]:
    """``"128,64,32"`` -> (128, 64, 32); raises ``ValueError`` naming the bad value."""
    try:
        out = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--layers {text!r}: expected comma-separated integers") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"--layers {text!r}: expected positive widths")
    return out


def train_argv(cfg: TrainConfig) -> list[str]:
    """Flags reproducing ``cfg`` for a child ``elastic-ctr train`` process."""
    argv = ["--data-train", *cfg.data_train] if cfg.data_train else []
    if cfg.data_test:
        argv += ["--data-test", *cfg.data_test]
    argv += ["--format", cfg.format, "--epochs", str(cfg.epochs), "--batch-size", str(cfg.batch_size),
             "--lr", repr(float(cfg.lr)), "--embedding-dim", str(cfg.embedding_dim),
             "--layers", ",".join(str(x) for x in cfg.layers), "--sparse-shards", str(cfg.sparse_shards),
             "--log-every-s", str(cfg.log_every_s), "--seed", str(cfg.seed), "--threads", str(cfg.threads),
             "--mode", cfg.mode, "--ps-mode", cfg.ps_mode]
    if cfg.ps_mode == "geo":
        argv += ["--geo-k-steps", str(cfg.geo_k_steps), "--geo-table-rows", str(cfg.geo_table_rows)]
    if cfg.mode == "continuous" or cfg.data_root:
        argv += ["--poll-s", str(cfg.poll_s), "--patch-every", str(cfg.patch_every),
                 "--base-every", str(cfg.base_every)]
    if cfg.max_bad_lines is not None:
        argv += ["--max-bad-lines", str(cfg.max_bad_lines)]
    if cfg.max_bad_fraction is not None:
        argv += ["--max-bad-fraction", str(cfg.max_bad_fraction)]
    for flag, v in (("--slot-file", cfg.slot_file), ("--output", cfg.output),
                    ("--upload-token-file", cfg.upload_token_file), ("--test-limit", cfg.test_limit),
                    ("--dump-predictions", cfg.dump_predictions), ("--table-dir", cfg.table_dir),
                    ("--work-dir", cfg.work_dir), ("--data-root", cfg.data_root),
                    ("--start-hour", cfg.start_hour), ("--end-hour", cfg.end_hour),
                    ("--state-dir", cfg.state_dir)):
        if v is not None:
            argv += [flag, str(v)]
    return argv
