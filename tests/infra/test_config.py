"""Stack config: one typed model is the source of Pulumi.yaml; parse() validates each key and
reports every problem at once, naming the key, the value and what is allowed."""
from __future__ import annotations

import pydantic
import pytest
import yaml

from infra.config import FIELDS, PROJECT_FILE, SECRETS, ConfigError, StackConfig
from infra.config_load import parse
from infra.pulumi_yaml import pulumi_yaml
from runtime.trainer.config import TrainConfig

TOKEN = "t" * 32
OK = {"uploadToken": TOKEN}
SECRET = {"uploadToken"}


def errors_of(raw: dict, secrets=SECRET) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse(raw, secrets)
    return exc.value.errors


def test_pulumi_yaml_is_generated_from_the_model():
    """Pulumi.yaml's config block is the model's (make pulumi-yaml rewrites it): a key or a
    default changed on one side only fails here."""
    assert PROJECT_FILE.read_text() == pulumi_yaml()
    doc = yaml.safe_load(PROJECT_FILE.read_text())
    assert doc["name"] == "elastic-ctr" and doc["main"] == "infra/" and doc["runtime"]["options"]["virtualenv"] == ".venv"
    assert set(doc["config"]) == set(FIELDS) | set(SECRETS)
    for key, decl in doc["config"].items():
        assert decl["type"] in ("string", "integer", "boolean") and decl["description"], key
        # every key has a default (Pulumi takes none for a `secret: true` key: secrets are
        # declared empty and parse() checks they are stored as secrets and, where needed, set)
        assert "default" in decl and not decl.get("secret"), key
    assert doc["config"]["uploadToken"]["default"] == ""


def test_training_defaults_are_the_trainers():
    train, cfg = TrainConfig(), StackConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.learning_rate, cfg.embedding_dim, cfg.pserver_table_shards, cfg.data_format) == (
        train.epochs, train.batch_size, train.lr, train.embedding_dim, train.pserver_table_shards, train.format)


def test_defaults_parse_to_a_typed_frozen_config_without_secrets():
    cfg = parse(OK, SECRET)
    assert (cfg.trainers, cfg.pservers, cfg.cube_shards, cfg.cube_replicas) == (2, 1, 2, 2)
    assert cfg.expose_file_server is False and cfg.data_train() == ("generated",) and cfg.generated
    assert (cfg.training_shared_storage_class, cfg.training_shared_size) == ("", "5Gi")
    assert TOKEN not in repr(cfg) and not hasattr(cfg, "upload_token")
    with pytest.raises(pydantic.ValidationError):
        cfg.trainers = 3  # type: ignore[misc]


def test_string_values_from_pulumi_are_coerced():
    cfg = parse({**OK, "trainers": "5", "exposeFileServer": "true", "fileServerSourceRanges": "10.0.0.0/8",
                 "learningRate": "0.01",
                 "dataSource": "a.txt, b/*", "dataTestSource": "t.txt"}, SECRET)
    assert cfg.trainers == 5 and cfg.expose_file_server is True and cfg.learning_rate == 0.01
    assert cfg.data_train() == ("a.txt", "b/*") and cfg.data_test() == ("t.txt",)


@pytest.mark.parametrize("key,value,needle", [
    ("trainers", "0", "elastic-ctr:trainers: 0 is invalid; allowed: an integer in [1, 128]"),
    ("trainers", "129", "elastic-ctr:trainers: 129 is invalid; allowed: an integer in [1, 128]"),
    ("pservers", "33", "elastic-ctr:pservers: 33 is invalid; allowed: an integer in [1, 32]"),
    ("cubeShards", "0", "elastic-ctr:cubeShards: 0 is invalid; allowed: an integer in [1, 64]"),
    ("cubeReplicas", "17", "elastic-ctr:cubeReplicas: 17 is invalid; allowed: an integer in [1, 16]"),
    ("servingReplicas", "0", "elastic-ctr:servingReplicas: 0 is invalid"),
    ("epochs", "0", "elastic-ctr:epochs: 0 is invalid; allowed: an integer in [1, 1000]"),
    ("batchSize", "70000", "elastic-ctr:batchSize: 70000 is invalid; allowed: an integer in [1, 65536]"),
    ("embeddingDim", "0", "elastic-ctr:embeddingDim: 0 is invalid"),
    ("pserverTableShards", "0", "elastic-ctr:pserverTableShards: 0 is invalid"),
    ("servingTargetCpuUtilization", "5", "elastic-ctr:servingTargetCpuUtilization: 5 is invalid"),
    ("servingWorkers", "0", "elastic-ctr:servingWorkers: 0 is invalid"),
    ("trainers", "two", "elastic-ctr:trainers: 'two' is not an integer"),
    ("exposeFileServer", "yes", "elastic-ctr:exposeFileServer: 'yes' is invalid; allowed: true or false"),
    ("trainerCpu", "lots", "elastic-ctr:trainerCpu: 'lots' is invalid; allowed: a CPU quantity"),
    ("servingCpu", "100", "elastic-ctr:servingCpu: '100' is invalid; allowed: a CPU quantity from 10m to 64"),
    ("pserverMemory", "4GB", "elastic-ctr:pserverMemory: '4GB' is invalid; allowed: a memory quantity"),
    ("cubeServerMemory", "1Mi", "elastic-ctr:cubeServerMemory: '1Mi' is invalid; allowed: a memory quantity from 64Mi to 512Gi"),
    ("fileServerStorageSize", "big", "elastic-ctr:fileServerStorageSize: 'big' is invalid; allowed: a storage quantity"),
    ("dataFormat", "csv", "elastic-ctr:dataFormat: 'csv' is invalid; allowed: criteo | slot"),
    ("trainingMode", "online", "elastic-ctr:trainingMode: 'online' is invalid; allowed: batch | continuous"),
    ("dataStartHour", "2026-11-20", "elastic-ctr:dataStartHour: '2026-11-20' is invalid; allowed: empty or an hour"),
    ("baseEveryMinutes", "0", "elastic-ctr:baseEveryMinutes: 0 is invalid; allowed: an integer in [1, 525600]"),
    ("partitionMinutes", "0", "elastic-ctr:partitionMinutes: 0 is invalid; allowed: an integer in [1, 1440]"),
    ("psMode", "sync", "elastic-ctr:psMode: 'sync' is invalid; allowed: async | async-merged | geo"),
    ("trainerThreads", "0", "elastic-ctr:trainerThreads: 0 is invalid; allowed: an integer in [1, 64]"),
    ("imagePullPolicy", "Sometimes", "elastic-ctr:imagePullPolicy: 'Sometimes' is invalid"),
    ("buildPlatform", "linux/386", "elastic-ctr:buildPlatform: 'linux/386' is invalid"),
    ("namespace", "Elastic_CTR", "elastic-ctr:namespace: 'Elastic_CTR' is invalid; allowed: a DNS-1123 label"),
    ("namespace", "a" * 64, "elastic-ctr:namespace:"),
    ("volcanoQueue", "Q!", "elastic-ctr:volcanoQueue: 'Q!' is invalid"),
    ("storageClass", "Fast SSD", "elastic-ctr:storageClass: 'Fast SSD' is invalid"),
    ("trainingSharedStorageClass", "NFS_Client",
     "elastic-ctr:trainingSharedStorageClass: 'NFS_Client' is invalid; allowed: empty or a StorageClass name"),
    ("trainingSharedSize", "5GB", "elastic-ctr:trainingSharedSize: '5GB' is invalid; allowed: a storage quantity"),
    ("trainingSharedSize", "0", "elastic-ctr:trainingSharedSize: '0' is invalid; allowed: a storage quantity from 1Mi"),
    ("imageTag", "v1:2", "elastic-ctr:imageTag: 'v1:2' is invalid; allowed: a Docker tag"),
    ("imageRegistry", "HTTP://reg", "elastic-ctr:imageRegistry: 'HTTP://reg' is invalid"),
    ("learningRate", "0", "elastic-ctr:learningRate: 0 is invalid; allowed: a decimal number in (0, 1]"),
    ("learningRate", "fast", "elastic-ctr:learningRate: 'fast' is not a decimal number"),
    ("dataSource", "", "elastic-ctr:dataSource: '' is invalid; allowed: \"generated\" or comma-separated locations"),
])
def test_each_bad_value_names_key_value_and_range(key, value, needle):
    errors = errors_of({**OK, key: value})
    assert any(needle in e for e in errors), errors


@pytest.mark.parametrize("raw,needle", [
    ({"servingReplicas": "4", "servingMaxReplicas": "3"},
     "elastic-ctr:servingMaxReplicas: 3 is invalid; allowed: 0 (no autoscaler) or more than servingReplicas (4)"),
    ({"servingMaxReplicas": "201"}, "elastic-ctr:servingMaxReplicas: 201 is invalid"),
    ({"dataFormat": "slot", "dataSource": "s3.txt", "dataTestSource": "t.txt"},
     "elastic-ctr:slotFile: '' is invalid; allowed: a slot-list location"),
    ({"dataSource": "train.txt"}, "elastic-ctr:dataTestSource: '' is invalid"),
    ({"dataFormat": "slot", "slotFile": "slots.txt"},
     "elastic-ctr:dataFormat: 'slot' is invalid; allowed: criteo with dataSource \"generated\""),
    ({"uploadToken": "short"}, "elastic-ctr:uploadToken: [secret, 5 characters] is invalid; allowed: at least 16"),
    ({"registryPassword": "pw"}, "elastic-ctr:registryPassword: [secret] is set without imageRegistry"),
    ({"trainer": "3"}, "elastic-ctr:trainer: unknown key (did you mean elastic-ctr:trainers?)"),
    ({"trainingMode": "continuous", "dataSource": "/d"},
     "elastic-ctr:dataStartHour: '' is invalid; allowed: an hour YYYYMMDD/HH, or a partition YYYYMMDD/HHMM when "
     "partitionMinutes is under 60 (required when trainingMode is continuous)"),
    ({"trainingMode": "continuous", "dataStartHour": "20261120/00"},
     "elastic-ctr:dataSource: 'generated' is invalid; allowed: a partition root"),
    ({"trainingMode": "continuous", "dataSource": "/d", "dataStartHour": "20261120/00", "psMode": "geo"},
     "elastic-ctr:psMode: 'geo' is invalid; allowed: async or async-merged when trainingMode is continuous"),
    ({"trainingMode": "continuous", "dataSource": "/d", "dataStartHour": "20261120/00", "partitionMinutes": "45"},
     "elastic-ctr:partitionMinutes: 45 is invalid; allowed: minutes that divide an hour"),
    ({"dataSource": "/d", "dataStartHour": "20261120/00"},
     "elastic-ctr:dataEndHour: '' is invalid; allowed: an hour YYYYMMDD/HH, or a partition YYYYMMDD/HHMM when "
     "partitionMinutes is under 60 (batch mode over partitions needs an end)"),
    ({"dataSource": "/d", "dataStartHour": "20261120/05", "dataEndHour": "20261120/01"},
     "elastic-ctr:dataEndHour: '20261120/01' is invalid; allowed: an hour not before dataStartHour"),
    ({"trainerThreads": "3", "trainerCpu": "2"},
     "elastic-ctr:trainerThreads: 3 is invalid; allowed: at most the trainer pod's whole CPUs (trainerCpu 2)"),
])
def test_cross_key_rules(raw, needle):
    errors = errors_of({**OK, **raw}, SECRET | {"registryPassword"})
    assert any(needle in e for e in errors), errors


def test_missing_required_secret():
    errors = errors_of({})
    assert any(e.startswith("elastic-ctr:uploadToken: required, not set") for e in errors), errors


def test_upload_token_is_not_needed_when_the_versions_live_on_an_object_store():
    parse({"modelRoot": "s3://ctr-bucket/versions"})  # no file server: no token, no error
    errors = errors_of({"modelRoot": ""})
    assert any(e.startswith("elastic-ctr:uploadToken: required, not set") for e in errors), errors


def test_secrets_stored_in_plain_text_are_refused_without_echoing_them():
    raw = {**OK, "imageRegistry": "ghcr.io/acme", "registryUsername": "bot",
           "registryPassword": "hunter2-hunter2"}
    errors = errors_of(raw, secrets=set())
    assert any("elastic-ctr:uploadToken: [value hidden] is stored in plain text" in e
               for e in errors)
    assert any("elastic-ctr:registryPassword: [value hidden] is stored in plain text" in e
               for e in errors)
    assert not any(TOKEN in e or "hunter2" in e for e in errors)
    parse(raw, {"uploadToken", "registryPassword"})  # stored as secrets: accepted


def test_all_errors_reported_together():
    errors = errors_of({**OK, "trainers": "0", "cubeShards": "99", "servingCpu": "x",
                        "namespace": "BAD"})
    keys = {e.split(":")[1] for e in errors}
    assert {"trainers", "cubeShards", "servingCpu", "namespace"} <= keys
    assert len(errors) == 4


# ---------------------------------------------------------------- one source for the training rules
def _train_cli(argv: list[str]):
    """``elastic-ctr train ARGV`` parsed and turned into the trainer's settings (what the
    ``train`` command does before anything starts)."""
    import argparse

    from runtime.trainer import cli
    from runtime.trainer.config import config_from_args

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return config_from_args(parser.parse_args(["train", *argv]))


_CONT = ["--mode", "continuous", "--data-root", "/d", "--start-hour", "20261120/00", "--state-dir", "/s"]
_STACK_CONT = {"trainingMode": "continuous", "dataSource": "/d", "dataStartHour": "20261120/00"}


@pytest.mark.parametrize("argv,raw,flag_message,key_message", [
    ([*_CONT[:-4], "--start-hour", "20261120/0003", "--state-dir", "/s", "--partition-minutes", "5"],
     {**_STACK_CONT, "dataStartHour": "20261120/0003", "partitionMinutes": "5"},
     "--start-hour '20261120/0003' is invalid; allowed: a partition of --partition-minutes (5)",
     "elastic-ctr:dataStartHour: '20261120/0003' is invalid; allowed: a partition of partitionMinutes (5)"),
    ([*_CONT, "--ps-mode", "geo"], {**_STACK_CONT, "psMode": "geo"},
     "--ps-mode 'geo' is invalid; allowed: async or async-merged when --mode is continuous",
     "elastic-ctr:psMode: 'geo' is invalid; allowed: async or async-merged when trainingMode is continuous"),
    (["--data-root", "/d", "--start-hour", "20261120/05", "--end-hour", "20261120/01"],
     {"dataSource": "/d", "dataStartHour": "20261120/05", "dataEndHour": "20261120/01"},
     "--end-hour '20261120/01' is invalid; allowed: an hour not before --start-hour (20261120/05)",
     "elastic-ctr:dataEndHour: '20261120/01' is invalid; allowed: an hour not before dataStartHour (20261120/05)"),
    (["--data-root", "/d", "--start-hour", "20261120/05"], {"dataSource": "/d", "dataStartHour": "20261120/05"},
     "--end-hour is not set; allowed: an hour YYYYMMDD/HH, or a partition YYYYMMDD/HHMM when --partition-minutes is "
     "under 60 (batch mode over partitions needs an end)",
     "elastic-ctr:dataEndHour: '' is invalid; allowed: an hour YYYYMMDD/HH, or a partition YYYYMMDD/HHMM when "
     "partitionMinutes is under 60 (batch mode over partitions needs an end)"),
    (["--data-train", "x", "--epochs", "0"], {"epochs": "0"},
     "--epochs 0 is invalid; allowed: an integer in [1, 1000]",
     "elastic-ctr:epochs: 0 is invalid; allowed: an integer in [1, 1000]"),
    (["--data-train", "x", "--lr", "1.5"], {"learningRate": "1.5"},
     "--lr 1.5 is invalid; allowed: a decimal number in (0, 1]",
     "elastic-ctr:learningRate: 1.5 is invalid; allowed: a decimal number in (0, 1]"),
    (["--data-train", "x", "--threads", "65"], {"trainerThreads": "65", "trainerCpu": "64"},
     "--threads 65 is invalid; allowed: an integer in [1, 64]",
     "elastic-ctr:trainerThreads: 65 is invalid; allowed: an integer in [1, 64]"),
])
def test_one_training_rule_fails_the_cli_and_the_stack_with_the_owners_words(argv, raw, flag_message, key_message):
    """A training rule is written once (``TrainConfig``): the same invalid settings fail
    ``elastic-ctr train`` naming the flag and the stack naming its key, with one text."""
    from runtime.trainer.config import TrainConfigError

    with pytest.raises(TrainConfigError) as exc:
        _train_cli(argv)
    assert flag_message in str(exc.value), str(exc.value)
    errors = errors_of({**OK, **raw})
    assert any(key_message in e for e in errors), errors


def test_stack_training_keys_are_the_trainers_fields():
    """The stack has no copy of a training range or default: each training key takes the
    trainer field's type, constraints and default; its cross-key rules are the trainer's
    (a valid stack builds a valid ``TrainConfig``)."""
    from infra.config import TRAIN_KEYS
    from runtime.trainer.config import FIELDS as TRAIN

    for key, name in TRAIN_KEYS.items():
        if key.startswith("data_") or key == "slot_file":  # stack strings: locations, "" for not set
            continue
        f = StackConfig.model_fields[key]
        assert (f.annotation, f.metadata, f.default) == (TRAIN[name].annotation, TRAIN[name].metadata,
                                                         TRAIN[name].default), key
    cfg = parse({**OK, **_STACK_CONT, "partitionMinutes": "1", "patchEverySeconds": "30",
                 "baseEveryMinutes": "360"}, SECRET).train_config()
    assert (cfg.mode, cfg.data_root, cfg.start_hour, cfg.partition_minutes, cfg.patch_every_seconds,
            cfg.base_every_minutes, cfg.data_train) == ("continuous", "/d", "20261120/00", 1, 30.0, 360, [])
    assert parse(OK, SECRET).train_config() == TrainConfig(data_train=["generated"], state_dir=None)
