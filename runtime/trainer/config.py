"""The training settings and their rules: ``TrainConfig``, one pydantic model that owns every
training rule (types, ranges, choices, the cross-field rules such as the partition names
fitting ``partition_minutes``, GEO vs continuous, the end partition not before the start).

Both inputs build it: ``elastic-ctr train`` (its flags, their ``--help`` text and defaults
come from the fields here; ``--config`` YAML keys are the flags with ``_`` for ``-``) and
the stack config (``infra/config.py`` maps its camelCase keys onto these fields). An invalid
value raises ``TrainConfigError``: a list of ``Problem`` s, each naming the field, the value
and what is allowed; ``render`` names each field as its input does (``--base-every-minutes``
for the CLI, ``baseEveryMinutes`` for the stack). Imports no Paddle and nothing of Pulumi, so ``--help``,
the local pipeline and the Pulumi program can read the defaults."""
from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, NamedTuple, Optional, Union, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from runtime.formats import features, partitions
from runtime.trainer.gate_config import GateFields
from runtime.trainer import lifecycle
from runtime.trainer.lifecycle import LifecycleFields
from runtime.trainer.flags import flag

MODES = ("batch", "continuous")
#: the parameter-server flavours (runtime.trainer.program.strategy)
PS_MODES = ("async", "async-merged", "geo")
HOUR = "an hour YYYYMMDD/HH, or a partition YYYYMMDD/HHMM when {partition_minutes} is under 60"
REAL_HOUR = HOUR + " (a real UTC date and time, e.g. 20261120/00)"
TABLE_DIR_PREFIX = "elastic-ctr-table-"


class Problem(NamedTuple):
    """One broken rule: ``field`` (a ``TrainConfig`` field name), the ``value`` given (None
    when not set) and what is ``allowed``; ``allowed`` may name other fields as
    ``{field_name}``, filled in by ``render`` with the input's own names."""

    field: str
    value: Any
    allowed: str

    def render(self, name: Callable[[str], str]) -> str:
        """``'<name> <value> is invalid; allowed: <allowed>'`` (or ``'<name> is not set;
        ...'``) with every field named by ``name(field)`` (e.g. ``flag``)."""
        text = self.allowed_for(name)
        if self.value in (None, "", [], ()):
            return f"{name(self.field)} is not set; allowed: {text}"
        return f"{name(self.field)} {self.value!r} is invalid; allowed: {text}"

    def allowed_for(self, name: Callable[[str], str]) -> str:
        """``allowed`` with every field it refers to named by ``name(field)``."""
        return self.allowed.format_map(_Names(name))


class _Names(dict):
    def __init__(self, name: Callable[[str], str]):
        super().__init__()
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name(key)


class TrainConfigError(ValueError):
    """Invalid training settings; ``problems``: list[Problem]. ``str()`` names the flags."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("; ".join(p.render(flag) for p in self.problems))

    @classmethod
    def from_validation(cls, exc: ValidationError) -> "TrainConfigError":
        """The problems of a failed ``TrainConfig`` validation (field errors: what the field
        allows; cross-field errors: the model validator's problems)."""
        problems = []
        for err in exc.errors():
            if not err["loc"]:
                problems += err["ctx"]["error"].args[0]
                continue
            name = str(err["loc"][0])
            if name not in FIELDS:
                text = f"no such setting (known: {', '.join(FIELDS)})"
            else:
                text = str(err["ctx"]["error"]) if err["type"] == "value_error" else allowed(name)
            problems.append(Problem(name, err.get("input"), text))
        return cls(problems)


def _hour(text: str | None) -> str | None:
    if text is not None:
        try:  # the name's syntax here; its fit with partition_minutes in TrainConfig._rules
            partitions.Partition.parse(text, minutes=1)
        except ValueError:
            raise ValueError(REAL_HOUR) from None
    return text


def _local_dir(path: str | None) -> str | None:
    if path is not None and "://" in str(path):
        raise ValueError("a local directory, not a URL")
    return path


def _listed(v):
    return [v] if isinstance(v, str) else v


LAYERS = "positive widths, comma-separated (e.g. 128,64,32)"


def _layers(v):
    """``"128,64,32"`` -> (128, 64, 32); other values pass to the type check."""
    if not isinstance(v, str):
        return v
    try:
        return tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise ValueError(LAYERS) from None


Hour = Annotated[Optional[str], AfterValidator(_hour)]
LocalDir = Annotated[Optional[str], AfterValidator(_local_dir)]
Locations = Annotated[list[str], BeforeValidator(_listed)]


def _f(default, description: str, **kw):
    extra = {k: kw.pop(k) for k in ("metavar", "allowed") if k in kw}
    return Field(default, description=description, json_schema_extra=extra or None, **kw)


class TrainConfig(GateFields, LifecycleFields):
    """Everything ``train`` needs; field ``x_y`` is flag ``--x-y`` and ``--config`` key
    ``x_y`` (or ``x-y``). Frozen; built only through validation (``TrainConfig(**values)``
    raises ``TrainConfigError``). Durations in seconds (``*_s``); ``layers``: hidden widths.
    Each field's ``description`` is its ``--help`` text. The data gate's fields come from
    ``runtime.trainer.gate_config.GateFields``, the feature lifecycle's from
    ``runtime.trainer.lifecycle.LifecycleFields``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_train: Locations = _f([], "training data: paths, globs, dirs or URLs", metavar="LOC")
    data_test: Locations = _f([], "test data (test AUC after each pass)", metavar="LOC")
    format: Literal[features.FORMATS] = _f("criteo", "input format")
    slot_file: Optional[str] = _f(None, "slot list for --format slot (one slot id per line; default 1..26)")
    epochs: int = _f(2, "passes over the training data", ge=1, le=1000)
    batch_size: int = _f(512, "examples per batch per trainer", ge=1, le=65536)
    lr: float = _f(0.002, "Adam learning rate", gt=0, le=1)
    embedding_dim: int = _f(9, "embedding width", ge=1, le=512)
    layers: Annotated[tuple[Annotated[int, at.Ge(1)], ...], BeforeValidator(_layers)] = _f(
        (128, 64, 32), "hidden layer widths, comma-separated", min_length=1, allowed=LAYERS)
    pserver_table_shards: int = _f(8, "sparse table shard_num", ge=1, le=256)
    output: Optional[str] = _f(None, "version root: a directory or the file server's URL (export if set)")
    upload_token_file: Optional[str] = _f(None, "file holding the upload token (else $ELASTIC_CTR_UPLOAD_TOKEN)")
    max_bad_lines: Optional[int] = _f(100, "malformed lines allowed before training stops")
    max_bad_fraction: Optional[float] = _f(None, "malformed fraction allowed (default: not checked)")
    log_every_s: float = _f(5.0, "seconds between progress lines")
    test_limit: Optional[int] = _f(None, "evaluate on at most this many test rows")
    single_vocab_size: int = _f(1 << 20, "--single: embedding rows", ge=1)
    dump_predictions: Optional[str] = _f(None, "save trainer 0's final test predictions (.npy) here")
    seed: int = _f(1, "random seed of the initializers")
    wait_pserver_s: float = _f(120.0, "seconds a trainer waits for the pservers")
    table_dir: Optional[str] = _f(
        None, "base directory of the sparse-table save at export: the pservers write the table into a fresh "
              "subdirectory of DIR on their own file system, trainer 0 reads it back, then removes it (default: "
              "the system temp dir). In Kubernetes DIR must be a volume shared by the pserver and trainer pods "
              "(ReadWriteMany), mounted at the same path", metavar="DIR")
    threads: int = _f(1, "dataset threads per trainer (train_from_dataset thread_num); the trainer's shard is "
                         "staged as this many files", ge=1, le=64)
    ps_mode: Literal[PS_MODES] = _f(
        "async", "parameter-server flavour: async = every batch's gradients pushed as they are; async-merged = "
                 "Paddle's client defaults (up to 13 batches summed into one push); geo = GEO-SGD, each trainer "
                 "trains a local hashed table and exchanges deltas every --geo-k-steps batches (batch mode only). "
                 "Measured figures: docs/training.md")
    geo_k_steps: int = _f(100, "--ps-mode geo: batches between exchanges", ge=1, le=100000)
    geo_table_rows: int = _f(1 << 20, "--ps-mode geo: rows of the hashed table (feasign -> 1 + feasign mod "
                                      "(rows - 1))", ge=2)
    work_dir: LocalDir = _f(None, "where the trainer stages its shard as MultiSlot files before Paddle loads them "
                                  "(removed once loaded; default: the system temp dir)", metavar="DIR")
    mode: Literal[MODES] = _f(
        "batch", "batch: --epochs passes over the training data, one base version; continuous: the partitions "
                 "of --data-root in order, each once, a patch version after every partition (at most one per "
                 "--patch-every-seconds) and a base every --base-every-minutes")
    data_root: Optional[str] = _f(None, "partitions ROOT/YYYYMMDD/HH/ (ROOT/YYYYMMDD/HHMM/ when "
                                        "--partition-minutes is under 60; a directory, the file server's URL or "
                                        "an object-store prefix); a partition is read once its _SUCCESS marker "
                                        "exists", metavar="ROOT")
    partition_minutes: int = _f(60, "the partitions' period in minutes: 60 (hourly, ElasticCTR's layout) or a "
                                    "multiple of 60 dividing a day, or a divisor of 60 down to 1 (the minute "
                                    "layout ROOT/YYYYMMDD/HHMM/)", ge=1, le=1440)
    start_hour: Hour = _f(None, "first partition of --data-root", metavar="YYYYMMDD/HH[MM]", allowed=REAL_HOUR)
    end_hour: Hour = _f(None, "last partition (included); continuous mode without it follows the data",
                        metavar="YYYYMMDD/HH[MM]", allowed=REAL_HOUR)
    poll_seconds: float = _f(30.0, "continuous: seconds between looks for the next partition", gt=0)
    patch_every_seconds: int = _f(
        0, "continuous: least seconds between two exported versions: a version is exported after the first "
             "partition trained at least this long after the previous export (0: after every partition)",
        ge=0, le=7 * 86400)
    base_every_minutes: int = _f(1440, "continuous: minutes of data (partitions x their period) between two base "
                                       "versions; the versions between are patches", ge=1, le=525600)
    checkpoint_every_minutes: int = _f(
        1440, "continuous: minutes of data between two checkpoints of the tables (taken after the export is "
              "published, and at --end-hour); a restarted job trains the partitions since the last one again",
        ge=1, le=525600)
    state_dir: LocalDir = _f(None, "continuous: the state file and checkpoints a restarted job resumes from (in "
                                   "Kubernetes a volume shared by every pod of the job)", metavar="DIR")

    def __init__(self, **values: Any) -> None:
        """Validates ``values`` (field name -> value); raises ``TrainConfigError``."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise TrainConfigError.from_validation(exc) from None

    @model_validator(mode="after")
    def _rules(self) -> "TrainConfig":
        """The cross-field rules; every broken one is reported (``Problem``)."""
        out = []
        if self.ps_mode == "geo" and self.mode == "continuous":
            out.append(Problem("ps_mode", "geo", "async or async-merged when {mode} is continuous (GEO keeps its "
                                                 "table in the trainers: no patch saves, no resume)"))
        out += [Problem(*p) for p in lifecycle.problems(self)]
        if self.data_root and self.data_train:
            out.append(Problem("data_train", self.data_train, "empty when {data_root} is given (give one of them)"))
        if self.mode == "continuous":
            if not self.data_root:
                out.append(Problem("data_root", None, "a partition root ROOT with hourly partitions "
                                                      "ROOT/YYYYMMDD/HH/ (required when {mode} is continuous)"))
            if not self.start_hour:
                out.append(Problem("start_hour", None, HOUR + " (required when {mode} is continuous)"))
            if not self.state_dir:
                out.append(Problem("state_dir", None, "a local directory (required when {mode} is continuous: the "
                                                      "state file and checkpoints that a restarted job resumes "
                                                      "from; in Kubernetes a volume shared by every pod)"))
        elif self.data_root and self.start_hour and not self.end_hour:
            out.append(Problem("end_hour", None, HOUR + " (batch mode over partitions needs an end)"))
        if self.end_hour and not self.start_hour:
            out.append(Problem("start_hour", None, HOUR + " ({end_hour} is set)"))
        elif self.data_root and not self.start_hour and self.mode == "batch":
            out.append(Problem("start_hour", None, HOUR + " (required with {data_root})"))
        if (self.start_hour or self.end_hour) and not self.data_root:
            out.append(Problem("data_root", None, "a partition root ROOT/YYYYMMDD/HH/ ({start_hour}/{end_hour} "
                                                  "need {data_root})"))
        try:
            partitions.check_period(self.partition_minutes)
        except ValueError as exc:
            out.append(Problem("partition_minutes", self.partition_minutes, str(exc).split(": ", 1)[1]))
            raise ValueError(out) from None
        for name in ("start_hour", "end_hour"):
            text = getattr(self, name)
            try:
                if text:
                    partitions.Partition.parse(text, minutes=self.partition_minutes)
            except ValueError as exc:
                out.append(Problem(name, text, f"a partition of {{partition_minutes}} ({self.partition_minutes}): "
                                               f"{str(exc).split(': ', 1)[1]}"))
        if out:
            raise ValueError(out)
        if self.start_hour and self.end_hour and self.hours()[1] < self.hours()[0]:
            out.append(Problem("end_hour", self.end_hour, f"an hour not before {{start_hour}} ({self.start_hour})"))
        if out:
            raise ValueError(out)
        return self

    def hours(self) -> tuple[partitions.Partition | None, partitions.Partition | None]:
        """(first, last) partition of ``partition_minutes``, each None when not set."""
        return tuple(partitions.Partition.parse(h, minutes=self.partition_minutes) if h else None
                     for h in (self.start_hour, self.end_hour))

    def partition(self, name: str, what: str = "partition") -> partitions.Partition:
        """The partition named ``name`` (``YYYYMMDD/HH[MM]``) of ``partition_minutes``;
        raises ``PartitionError`` naming ``what``."""
        return partitions.Partition.parse(name, what, minutes=self.partition_minutes)

    def slots(self) -> tuple[int, ...]:
        """The slot list (from ``slot_file`` for the slot format, else 1..26)."""
        if self.format == "slot" and self.slot_file:
            from runtime import storage

            return features.load_slots(storage.read_bytes(self.slot_file).decode())
        return features.DEFAULT_SLOTS


FIELDS = TrainConfig.model_fields


def base_type(annotation):
    """``Optional[X]`` -> X."""
    if get_origin(annotation) is Union:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def bounds(name: str) -> tuple[Any, Any, bool]:
    """(lower, upper, lower excluded) of a numeric field; None where unbounded."""
    lo = hi = None
    open_lo = False
    for m in FIELDS[name].metadata:
        if isinstance(m, at.Ge):
            lo = m.ge
        elif isinstance(m, at.Gt):
            lo, open_lo = m.gt, True
        elif isinstance(m, at.Le):
            hi = m.le
    return lo, hi, open_lo


def choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a choice field (``Literal``), else None."""
    ann = base_type(FIELDS[name].annotation)
    return tuple(get_args(ann)) if get_origin(ann) is Literal else None


def allowed(name: str) -> str:
    """What field ``name`` allows, in words: ``an integer in [1, 1000]``, ``a decimal
    number in (0, 1]``, ``async | async-merged | geo``, ..."""
    f = FIELDS[name]
    if isinstance(f.json_schema_extra, dict) and "allowed" in f.json_schema_extra:
        return f.json_schema_extra["allowed"]
    if choices(name):
        return " | ".join(choices(name))
    ann = base_type(f.annotation)
    kind = {int: "an integer", float: "a decimal number"}.get(ann)
    if kind is None:
        return "a list of locations" if get_origin(ann) is list else "a string"
    lo, hi, open_lo = bounds(name)
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if open_lo else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{kind} {'>' if open_lo else '>='} {lo}"
    return kind


def field_type(name: str):
    """The annotated type of field ``name`` (its type and constraints), for a model that
    takes the same value under another name (the stack config)."""
    f = FIELDS[name]
    return Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation


def hour_ok(text: str) -> bool:
    """True when ``text`` is a real partition name ``YYYYMMDD/HH`` or ``YYYYMMDD/HHMM``
    (its fit with a period is ``TrainConfig``'s rule)."""
    try:
        _hour(text)
        return True
    except ValueError:
        return False


def config_from_args(args) -> TrainConfig:
    """Merges ``--config FILE`` (YAML mapping; keys like the flags, ``-`` or ``_``) with
    flags given on the command line (flags win; a flag left out is None). Raises
    ``ValueError`` on unknown keys, ``TrainConfigError`` (naming the flags) on bad values."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        import yaml

        from runtime import storage

        data = yaml.safe_load(storage.read_bytes(args.config)) or {}
        if not isinstance(data, dict):
            raise ValueError(f"--config {args.config}: expected a YAML mapping")
        for k, v in data.items():
            key = str(k).replace("-", "_")
            if key not in FIELDS:
                raise ValueError(f"--config {args.config}: unknown key {k!r} (known: {sorted(FIELDS)})")
            values[key] = v
    for k in FIELDS:
        v = getattr(args, k, None)
        if v is not None:
            values[k] = v
    return TrainConfig(**values)
