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

    def slots(self) -> tuple[int, ...]:
        """The slot list (from ``slot_file`` for the slot format, else 1..26)."""
        if self.format == "slot" and self.slot_file:
            from runtime import storage

            return features.load_slots(storage.read_bytes(self.slot_file).decode())
        return features.DEFAULT_SLOTS


def check_inputs(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """Resolves train and test locations; raises ``storage.LocationError`` naming a missing
    file or unreachable URL, ``ValueError`` for bad settings. Call before starting anything."""
    if not cfg.data_train:
        raise ValueError("--data-train: no training data given")
    if cfg.format not in ("criteo", "slot"):
        raise ValueError(f"--format {cfg.format!r}: expected criteo or slot")
    for name in ("epochs", "batch_size", "embedding_dim", "sparse_shards"):
        if int(getattr(cfg, name)) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    if cfg.lr <= 0:
        raise ValueError(f"--lr must be > 0 (got {cfg.lr})")
    if not cfg.layers or any(int(x) < 1 for x in cfg.layers):
        raise ValueError(f"--layers: positive widths expected (got {cfg.layers})")
    train = readers.resolve(cfg.data_train)
    test = readers.resolve(cfg.data_test) if cfg.data_test else []
    if cfg.slot_file:
        from runtime import storage

        storage.check_readable(cfg.slot_file)
    if cfg.table_dir:
        check_table_dir(cfg.table_dir)
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
    argv = ["--data-train", *cfg.data_train]
    if cfg.data_test:
        argv += ["--data-test", *cfg.data_test]
    argv += ["--format", cfg.format, "--epochs", str(cfg.epochs), "--batch-size", str(cfg.batch_size),
             "--lr", repr(float(cfg.lr)), "--embedding-dim", str(cfg.embedding_dim),
             "--layers", ",".join(str(x) for x in cfg.layers), "--sparse-shards", str(cfg.sparse_shards),
             "--log-every-s", str(cfg.log_every_s), "--seed", str(cfg.seed)]
    if cfg.max_bad_lines is not None:
        argv += ["--max-bad-lines", str(cfg.max_bad_lines)]
    if cfg.max_bad_fraction is not None:
        argv += ["--max-bad-fraction", str(cfg.max_bad_fraction)]
    for flag, v in (("--slot-file", cfg.slot_file), ("--output", cfg.output),
                    ("--upload-token-file", cfg.upload_token_file), ("--test-limit", cfg.test_limit),
                    ("--dump-predictions", cfg.dump_predictions), ("--table-dir", cfg.table_dir)):
        if v is not None:
            argv += [flag, str(v)]
    return argv
