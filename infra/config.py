"""Stack configuration: every key, its type, default, allowed range and description, in one
typed model (``StackConfig``, pydantic); ``Pulumi.yaml``'s ``config:`` block is generated
from it (``make pulumi-yaml``; a test keeps the file in step). The training keys are the
trainer's own settings under stack names (``TRAIN_KEYS``): their types, ranges and defaults are
``runtime.trainer.config.TrainConfig``'s fields, and their cross-key rules are checked by
building that model (``StackConfig.train_config()``); this module keeps only the rules of the
stack itself (resources, replicas, generated data, secrets).

Reading and validating a stack's keys (``parse``, ``load``, the secrets) is
``infra.config_load``'s.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from infra import (config_gates, config_lifecycle, config_monitoring, config_security, config_storage, config_tracking,
                   config_versions)
from infra.config_types import check as _check, pulumi_bool as _pulumi_bool
from runtime import dense_backends
from runtime.trainer import config as train
from runtime.trainer.config import TrainConfig, TrainConfigError

PROJECT = "elastic-ctr"
REPO_ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILE = REPO_ROOT / "Pulumi.yaml"


class ConfigError(ValueError):
    """Invalid stack configuration; ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  - {e}" for e in errors))


# ---------------------------------------------------------------- value types
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def cpu_cores(q: str) -> Optional[float]:
    """Cores of a CPU quantity (``"500m"`` -> 0.5, ``"2"`` -> 2.0), or None if malformed."""
    m = re.fullmatch(r"(?:(\d+)m|(\d+(?:\.\d+)?))", q)
    if not m:
        return None
    return int(m.group(1)) / 1000 if m.group(1) is not None else float(m.group(2))


def byte_size(q: str) -> Optional[int]:
    """Bytes of a memory or storage quantity (``"1Gi"`` -> 1073741824), or None if malformed."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", q)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _int(lo: int, hi: int):
    return Annotated[int, _check(lambda v: lo <= v <= hi, f"an integer in [{lo}, {hi}]")]


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
Cpu = Annotated[str, _check(lambda v: (c := cpu_cores(v)) is not None and 0.01 <= c <= 64,
                            "a CPU quantity from 10m to 64 (e.g. 500m, 2)")]
Memory = Annotated[str, _check(lambda v: (b := byte_size(v)) is not None and 64 * 2**20 <= b <= 512 * 2**30,
                               "a memory quantity from 64Mi to 512Gi (e.g. 512Mi, 4Gi)")]
Storage = Annotated[str, _check(lambda v: (b := byte_size(v)) is not None and 2**20 <= b <= 64 * 2**40,
                                "a storage quantity from 1Mi to 64Ti (e.g. 20Gi)")]
DnsLabel = Annotated[str, _check(lambda v: len(v) <= 63 and bool(_DNS_LABEL.fullmatch(v)),
                                 "a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters")]
StorageClass = Annotated[str, _check(
    lambda v: v == "" or (len(v) <= 253 and bool(re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", v))),
    "empty or a StorageClass name (lowercase DNS subdomain)")]
Locations = Annotated[str, _check(lambda v: bool(v.strip(" ,")), '"generated" or comma-separated locations')]


def _choices(*values: str):
    return Annotated[str, _check(lambda v: v in values, " | ".join(values))]


Flag = Annotated[bool, BeforeValidator(_pulumi_bool)]
PullPolicy = _choices("IfNotPresent", "Always", "Never")
Platform = _choices("linux/amd64", "linux/arm64")
HourText = Annotated[str, _check(lambda v: v == "" or train.hour_ok(v), "empty or " + train.REAL_HOUR)]

#: stack training key (snake_case field) -> the ``TrainConfig`` field it sets
TRAIN_KEYS = {"epochs": "epochs", "batch_size": "batch_size", "learning_rate": "lr",
              "embedding_dim": "embedding_dim", "pserver_table_shards": "pserver_table_shards", "ps_mode": "ps_mode",
              "geo_k_steps": "geo_k_steps", "training_mode": "mode", "data_start_hour": "start_hour",
              "data_end_hour": "end_hour", "partition_minutes": "partition_minutes",
              "patch_every_seconds": "patch_every_seconds", "base_every_minutes": "base_every_minutes",
              "checkpoint_every_minutes": "checkpoint_every_minutes",
              "trainer_threads": "threads", "data_format": "format", "slot_file": "slot_file",
              "data_source": "data_train", "data_test_source": "data_test", **config_gates.TRAIN_KEYS,
              **config_lifecycle.TRAIN_KEYS}
#: ``TrainConfig`` field -> the stack key that sets it (``state_dir``: the component's volume)
KEY_OF = {**{v: to_camel(k) for k, v in TRAIN_KEYS.items()}, "data_root": "dataSource",
          "state_dir": "train --state-dir"}


def _train(key: str, description: str, **kw):
    """A training key's ``Field``: the trainer's default; ``{range}`` in ``description``
    becomes the trainer's bounds (``1-1000``)."""
    name = TRAIN_KEYS[key]
    lo, hi, _ = train.bounds(name)
    return Field(train.FIELDS[name].default, description=description.format(range=f"{lo}-{hi}"), **kw)


def _t(key: str):
    """The annotated type (with the trainer's constraints) of a training key."""
    return train.field_type(TRAIN_KEYS[key])


class StackConfig(config_storage.StorageKeys, config_tracking.TrackingKeys, config_monitoring.MonitoringKeys,
                  config_gates.GateKeys, config_lifecycle.LifecycleKeys, config_versions.VersionKeys,
                  config_security.SecurityKeys):
    """Every key of the stack (camelCase in Pulumi, snake_case here). Quantities are
    Kubernetes quantity strings (``500m`` CPU, ``512Mi`` memory, ``20Gi`` storage); data
    locations are comma-separated (``data_train()``/``data_test()`` split them). Each
    field's ``description`` is the one ``Pulumi.yaml`` shows; ``json_schema_extra`` carries
    its group there."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    # --- where and what
    namespace: DnsLabel = Field("elastic-ctr", description="Kubernetes namespace created for the stack (DNS-1123 label, at most 63 characters).")
    image_registry: Annotated[str, _check(lambda v: v == "" or bool(re.fullmatch(r"[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)*", v)),
                                          "empty or host[:port][/path], lowercase, e.g. ghcr.io/acme")] = Field(
        "", description="Registry (and optional path) the images are pushed to, e.g. ghcr.io/acme; empty = build locally, do not push.")
    image_tag: Annotated[str, _check(lambda v: bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", v)),
                                     "a Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")] = Field(
        "0.1.0", description="Tag of the trainer, cube and serving images.")
    image_pull_policy: PullPolicy = Field(
        "IfNotPresent", description="imagePullPolicy of every container (IfNotPresent, Always or Never).")
    build_platform: Platform = Field(
        "linux/amd64", description="Platform the images are built for (Paddle's CPU wheels are x86-64).")
    registry_username: str = Field(
        "", description="Registry user for pushing and pulling; empty = use the Docker client's login and the nodes' pull access.")
    volcano_queue: Annotated[str, _check(lambda v: len(v) <= 63 and bool(_DNS_LABEL.fullmatch(v)),
                                         "a Volcano queue name (DNS-1123 label)")] = Field(
        "default", description="Volcano queue the training job is submitted to (must exist).")
    storage_class: StorageClass = Field(
        "", description="StorageClass of the file server's and the transfer's volumes; empty = the cluster default.")
    file_server_storage_size: Storage = Field(
        "20Gi", description="Size of the file server's volume (models, SequenceFiles, shard tars).")
    transfer_storage_size: Storage = Field("1Gi", description="Size of the cube transfer's state volume.")
    training_shared_storage_class: StorageClass = Field(
        "", description="StorageClass of the training job's shared volume (ReadWriteMany, mounted at /shared by every "
                        "pserver and trainer pod; the pservers save the sparse table there for trainer 0 to export). "
                        "Must support RWX (NFS, CephFS, EFS, Filestore; hostPath on a single-node dev cluster); empty = "
                        "the cluster default.")
    training_shared_size: Storage = Field(
        "5Gi", description="Size of the training job's shared volume (holds one sparse-table save, gzip text, at a time).")
    expose_file_server: Flag = Field(
        False, description="Expose the file server outside the cluster with a LoadBalancer Service limited to "
                         "fileServerSourceRanges (required then); else ClusterIP only.")
    # --- training
    pservers: _int(1, 32) = Field(1, description="Parameter-server pods in the training job (1-32).",
                                  json_schema_extra={"group": "training"})
    trainers: _int(1, 128) = Field(2, description="Trainer pods in the training job (1-128).")
    epochs: _t("epochs") = _train("epochs", "Passes over the training data ({range}).")
    batch_size: _t("batch_size") = _train("batch_size", "Examples per trainer batch ({range}).")
    learning_rate: _t("learning_rate") = _train(
        "learning_rate", "Adam learning rate, " + train.allowed("lr") + ".")
    embedding_dim: _t("embedding_dim") = _train("embedding_dim", "Embedding dimension of each sparse slot ({range}).")
    pserver_table_shards: _t("pserver_table_shards") = _train(
        "pserver_table_shards", "Shards of the parameter servers' sparse table ({range}; its shard_num): "
                         "the save writes one part file per shard. Independent of cubeShards.")
    ps_mode: _t("ps_mode") = _train(
        "ps_mode", "Parameter-server mode: async (every batch pushes; the default), async-merged "
                   "(Paddle's client merges up to 12 batches per push: less traffic, lower AUC) or geo "
                   "(GEO-SGD: local tables exchanged every geoKSteps batches; fastest, hashed table). "
                   "See docs/training.md.")
    geo_k_steps: _t("geo_k_steps") = _train("geo_k_steps", "psMode geo: batches between exchanges ({range}).")
    training_mode: _t("training_mode") = _train(
        "training_mode", "batch: train dataSource once and export a base (the job completes); continuous: follow "
                         "the partitions of dataSource (every partitionMinutes) from dataStartHour, export a patch "
                         "after every partition (at most one per patchEverySeconds) and a base every "
                         "baseEveryMinutes (the job runs until dataEndHour, or for ever; restarted pods resume "
                         "from /shared/state). See docs/training.md and docs/freshness.md.")
    data_start_hour: HourText = Field(
        "", description="First partition, YYYYMMDD/HH (UTC; YYYYMMDD/HHMM when partitionMinutes is under 60): "
                        "dataSource is then a partition root ROOT/YYYYMMDD/HH/ (ROOT/YYYYMMDD/HHMM/ under an hour; a "
                        "partition is read once its _SUCCESS exists). Required when trainingMode is continuous.")
    data_end_hour: HourText = Field(
        "", description="Last partition, YYYYMMDD/HH (YYYYMMDD/HHMM under an hour); empty = follow the data "
                        "(continuous). Required in batch mode with dataStartHour.")
    partition_minutes: _t("partition_minutes") = _train(
        "partition_minutes", "Period of the data partitions in minutes ({range}): 60 = hourly ROOT/YYYYMMDD/HH/ "
        "(ElasticCTR's; or a multiple of 60 dividing a day), a divisor of 60 = ROOT/YYYYMMDD/HHMM/. docs/freshness.md.")
    patch_every_seconds: _t("patch_every_seconds") = _train(
        "patch_every_seconds", "Continuous: a version after every partition or every patchEverySeconds, whichever is "
        "later ({range}; 0: every partition).")
    base_every_minutes: _t("base_every_minutes") = _train(
        "base_every_minutes", "Continuous: minutes of data between two base versions ({range}); patches between.")
    checkpoint_every_minutes: _t("checkpoint_every_minutes") = _train(
        "checkpoint_every_minutes", "Continuous: minutes of data between two checkpoints of the parameter-server "
        "tables ({range}), taken after that partition's version is published (and at dataEndHour); a restarted job "
        "trains the partitions since the last checkpoint again.")
    trainer_threads: _t("trainer_threads") = _train(
        "trainer_threads", "Dataset threads per trainer pod ({range}; train --threads); at most the trainer's CPUs.")
    data_source: Locations = Field(
        "generated", description='Training data, comma-separated locations (paths, globs, HTTP(S) URLs); "generated" '
                                 "= the seeded Criteo-format generator run in each trainer pod.")
    data_test_source: str = Field(
        "", description='Test data, comma-separated locations; required unless dataSource is "generated".')
    data_format: _t("data_format") = _train("data_format", "Input format, criteo or slot.")
    slot_file: str = Field("", description="Slot list location; required when dataFormat is slot.")
    # --- cube
    cube_shards: _int(1, 64) = Field(
        2, description="Cube shards (1-64); key k lives on shard k % cubeShards. One StatefulSet per shard.",
        json_schema_extra={"group": "cube"})
    cube_replicas: _int(1, 16) = Field(2, description="Replicas per cube shard (1-16).")
    cube_data_size: Storage = Field(
        "10Gi", description="Size limit of each cube pod's data volume (downloaded tars and loaded dicts).")
    # --- serving
    serving_replicas: _int(1, 100) = Field(
        2, description="Serving pods (1-100); the autoscaler's minimum when servingMaxReplicas is set.",
        json_schema_extra={"group": "serving"})
    serving_max_replicas: _int(0, 200) = Field(
        0, description="Autoscaler maximum; 0 = no HorizontalPodAutoscaler. Otherwise greater than servingReplicas, "
                       "at most 200.")
    serving_target_cpu_utilization: _int(10, 100) = Field(
        70, description="Autoscaler target CPU utilization, percent of the request (10-100).")
    serving_workers: _int(1, 64) = Field(2, description="Worker processes per serving pod (1-64).")
    dense_backend: _choices(*dense_backends.BACKENDS) = Field(
        dense_backends.DEFAULT, description="What runs the dense network in serving: onnxruntime (ONNX Runtime on each "
        "version's model.onnx, in the serving image, which has no Paddle: a version the trainer published without "
        "model.onnx is refused, the previous one served) or paddle (Paddle Inference, in the serving-paddle image).")
    # --- resources: requests = limits
    pserver_cpu: Cpu = Field("1", description="CPU per parameter-server pod (e.g. 500m, 2); at most 64 cores.",
                             json_schema_extra={"group": "resources: requests = limits, Kubernetes quantities"})
    pserver_memory: Memory = Field("2Gi", description="Memory per parameter-server pod (e.g. 512Mi, 4Gi); at most 512Gi.")
    trainer_cpu: Cpu = Field("2", description="CPU per trainer pod.")
    trainer_memory: Memory = Field("4Gi", description="Memory per trainer pod.")
    cube_server_cpu: Cpu = Field("1", description="CPU per cube-server container.")
    cube_server_memory: Memory = Field(
        "2Gi", description="Memory per cube-server container (holds two versions of its shard while switching).")
    cube_agent_cpu: Cpu = Field("250m", description="CPU per cube-agent container.")
    cube_agent_memory: Memory = Field("512Mi", description="Memory per cube-agent container.")
    transfer_cpu: Cpu = Field("1", description="CPU of the cube transfer (runs the builder).")
    transfer_memory: Memory = Field("2Gi", description="Memory of the cube transfer.")
    file_server_cpu: Cpu = Field("500m", description="CPU of the file server.")
    file_server_memory: Memory = Field("512Mi", description="Memory of the file server.")
    serving_cpu: Cpu = Field("1", description="CPU per serving pod.")
    serving_memory: Memory = Field("2Gi", description="Memory per serving pod.")

    @model_validator(mode="after")
    def _cross_keys(self) -> "StackConfig":
        errors = []
        if self.serving_max_replicas and self.serving_max_replicas <= self.serving_replicas:
            errors.append(("servingMaxReplicas", self.serving_max_replicas,
                           f"0 (no autoscaler) or more than servingReplicas ({self.serving_replicas}), at most 200"))
        if self.data_format == "slot" and not self.slot_file:
            errors.append(("slotFile", "", "a slot-list location (required when dataFormat is slot)"))
        if not self.generated and not self.data_test() and not self.data_start_hour:
            errors.append(("dataTestSource", "", 'comma-separated locations (required unless dataSource is "generated")'))
        if self.generated and self.data_format == "slot":
            errors.append(("dataFormat", "slot", 'criteo with dataSource "generated" (the generator writes Criteo TSV)'))
        if self.training_mode == "continuous" and self.generated:
            errors.append(("dataSource", "generated", "a partition root ROOT (with ROOT/YYYYMMDD/HH/) when "
                                                      "trainingMode is continuous"))
        errors += self._training_problems()
        errors += self.budget_problems((self.pserver_memory, byte_size(self.pserver_memory)),
                                       (self.cube_server_memory, byte_size(self.cube_server_memory)),
                                       self.embedding_dim)
        cores = cpu_cores(self.trainer_cpu)
        if cores is not None and self.trainer_threads > max(1, int(cores)):
            errors.append(("trainerThreads", self.trainer_threads,
                           f"at most the trainer pod's whole CPUs (trainerCpu {self.trainer_cpu})"))
        if errors:
            raise ValueError(_CrossKey(errors))
        return self

    def train_config(self) -> TrainConfig:
        """The trainer's settings this stack gives the training job (what its pods' ``train``
        flags say; data locations as given, ``dataSource`` the partition root when an hour
        is set or the mode is continuous). Raises ``TrainConfigError``."""
        from components.training_job import STATE_DIR

        hourly = bool(self.data_start_hour or self.data_end_hour) or self.training_mode == "continuous"
        values = {name: getattr(self, key) for key, name in TRAIN_KEYS.items()}
        values.update(start_hour=self.data_start_hour or None, end_hour=self.data_end_hour or None,
                      slot_file=self.slot_file or None, data_train=[] if hourly else list(self.data_train()),
                      data_root=self.data_train()[0] if hourly else None, data_test=list(self.data_test()),
                      state_dir=STATE_DIR if self.training_mode == "continuous" else None,
                      data_schema=self.data_schema or None)
        return TrainConfig(**values)

    def _training_problems(self) -> list[tuple[str, Any, str]]:
        """The trainer's rules broken by this stack's training keys, as (stack key, value,
        allowed) with the trainer's text naming stack keys."""
        try:
            self.train_config()
        except TrainConfigError as exc:
            def key(name: str) -> str:
                return KEY_OF.get(name) or f"train {train.flag(name)}"

            return [(key(p.field), getattr(self, FIELDS.get(key(p.field), ("",))[0], p.value), p.allowed_for(key))
                    for p in exc.problems]
        return []

    @property
    def generated(self) -> bool:
        """True when the training data is generated in the trainer pods."""
        return self.data_train() == ("generated",)

    def data_train(self) -> tuple[str, ...]:
        return _locations(self.data_source)

    def data_test(self) -> tuple[str, ...]:
        return _locations(self.data_test_source)


class _CrossKey(str):
    """The cross-key problems of one validation, carried through pydantic as its message."""

    def __new__(cls, problems: list[tuple[str, Any, str]]):
        obj = super().__new__(cls, "; ".join(p[0] for p in problems))
        obj.problems = problems
        return obj


def _locations(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


#: secret keys: never in StackConfig; (description, minimum length or 0). Each is declared
#: with an empty default in Pulumi.yaml (Pulumi takes no default for a ``secret: true`` key)
#: and, when set, must be stored as a secret; ``uploadToken`` is required while the file
#: server holds the versions (``modelRoot`` empty).
SECRETS: dict[str, tuple[str, int]] = {
    "uploadToken": ("Bearer token for uploads to the file server (required unless modelRoot puts the versions on an "
                    "object store; pulumi config set --secret uploadToken \"$(openssl rand -hex 32)\"). Reaches pods "
                    "only via the file server's upload-token Secret.", 16),
    "registryPassword": ("Registry password or token (pulumi config set --secret registryPassword ...); it reaches "
                         "pods only as an imagePullSecret.", 0), **config_storage.SECRETS, **config_tracking.SECRETS,
    **config_security.SECRETS,
}
#: secrets required unless ``modelRoot`` is set (the file server is then not deployed)
REQUIRED_SECRETS = ("uploadToken",)
#: alias -> (field name, field), in Pulumi.yaml's order: the security, monitoring, data gate, then feature
#: lifecycle groups last
FIELDS = dict(sorted(((f.alias, (name, f)) for name, f in StackConfig.model_fields.items()),
                     key=lambda kv: (kv[1][0] in config_lifecycle.LifecycleKeys.model_fields,
                                     kv[1][0] in config_gates.GateKeys.model_fields,
                                     kv[1][0] in config_monitoring.MonitoringKeys.model_fields,
                                     kv[1][0] in config_security.SecurityKeys.model_fields)))
KEYS = list(FIELDS) + list(SECRETS)
