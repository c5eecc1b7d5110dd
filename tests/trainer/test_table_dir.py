"""``--table-dir``: where the pservers save the sparse table for trainer 0 to export.

Flag / ``--config`` plumbing, the per-save subdirectory (created, unique, removed), the
check before training, and reading the part files of several pservers from one directory.
"""
from __future__ import annotations

import argparse
import gzip
import os
import tempfile

import numpy as np
import pytest

from runtime import role_specs
from runtime.trainer import cli, config, export, input_checks, publish


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_flag_reaches_the_config_and_the_child_roles():
    cfg = config.config_from_args(_parse(["--data-train", "x.txt", "--table-dir", "/shared/table"]))
    assert cfg.table_dir == "/shared/table"
    argv = role_specs.train_argv(cfg)[1:]
    assert argv[argv.index("--table-dir") + 1] == "/shared/table"
    # the child parses back to the same value (what --local-cluster starts)
    assert config.config_from_args(_parse(argv)).table_dir == "/shared/table"
    default = config.config_from_args(_parse(["--data-train", "x.txt"]))
    assert default.table_dir is None and "--table-dir" not in role_specs.train_argv(default)


def test_config_yaml_key_and_flag_precedence(tmp_path):
    conf = tmp_path / "train.yaml"
    conf.write_text("data_train: x.txt\ntable_dir: /from/yaml\n")
    assert config.config_from_args(_parse(["--config", str(conf)])).table_dir == "/from/yaml"
    conf.write_text("data-train: x.txt\ntable-dir: /from/yaml\n")
    assert config.config_from_args(_parse(["--config", str(conf)])).table_dir == "/from/yaml"
    cfg = config.config_from_args(_parse(["--config", str(conf), "--table-dir", "/from/flag"]))
    assert cfg.table_dir == "/from/flag"


def test_save_dir_is_a_fresh_subdirectory_removed_afterwards(tmp_path):
    base = tmp_path / "shared" / "table"  # missing: created
    with publish.table_save_dir(str(base)) as a, publish.table_save_dir(str(base)) as b:
        assert a != b
        for d in (a, b):
            assert os.path.dirname(d) == str(base) and os.path.isdir(d) and os.listdir(d) == []
            assert os.path.basename(d).startswith(config.TABLE_DIR_PREFIX)
        os.makedirs(os.path.join(a, "000"))
        (base / os.path.basename(a) / "000" / "part-000-00000.gz").write_bytes(b"x")
    assert base.is_dir() and list(base.iterdir()) == []


def test_save_dir_removed_on_error_and_defaults_to_temp(tmp_path):
    with pytest.raises(RuntimeError):
        with publish.table_save_dir(str(tmp_path)) as d:
            raise RuntimeError("boom")
    assert not os.path.exists(d) and list(tmp_path.iterdir()) == []
    with publish.table_save_dir(None) as d:
        assert os.path.dirname(d) == tempfile.gettempdir()
    assert not os.path.exists(d)


def test_bad_table_dir_fails_before_training(tmp_path):
    data = tmp_path / "train.txt"
    data.write_text("")
    cfg = config.TrainConfig(data_train=[str(data)], table_dir="http://fs:8080/table")
    with pytest.raises(ValueError, match="--table-dir http://fs:8080/table: expected a local directory"):
        input_checks.check_inputs(cfg)
    blocker = tmp_path / "file"
    blocker.write_text("")
    # a path under a regular file cannot be created (TrainConfig is frozen: a new one)
    cfg = config.TrainConfig(data_train=[str(data)], table_dir=str(blocker / "table"))
    with pytest.raises(ValueError, match="--table-dir .*: cannot create a directory in it"):
        input_checks.check_inputs(cfg)
    with pytest.raises(ValueError, match="--table-dir"):
        with publish.table_save_dir(cfg.table_dir):
            pass
    input_checks.check_inputs(config.TrainConfig(data_train=[str(data)], table_dir=str(tmp_path / "ok")))
    assert (tmp_path / "ok").is_dir() and list((tmp_path / "ok").iterdir()) == []


def _part(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for key, emb in rows:
            # key, then slot unseen_days delta_score show click embed_w (unused), 4 optimizer
            # values, embedx_w (dim: the embedding), optimizer state
            cols = [1, 0, 0, 1, 0, 0.25, 0, 0, 0, 0, *emb, 0.5, 0.5]
            f.write(f"{key} " + " ".join(str(c) for c in cols) + "\n")


def test_part_files_of_several_pservers_in_one_dir_are_all_read(tmp_path):
    dim = 3
    _part(tmp_path / "000" / "part-000-00000.gz", [(10, [1.0, 2.0, 3.0]), (12, [4.0, 5.0, 6.0])])
    _part(tmp_path / "000" / "part-000-00001.gz", [(13, [7.0, 8.0, 9.0])])
    _part(tmp_path / "000" / "part-001-00000.gz", [(11, [-1.0, -2.0, -3.0])])  # second pserver
    keys, values = export.read_saved_table(str(tmp_path), dim)
    got = dict(zip(keys.tolist(), values.tolist()))
    assert got == {10: [1.0, 2.0, 3.0], 12: [4.0, 5.0, 6.0], 13: [7.0, 8.0, 9.0],
                   11: [-1.0, -2.0, -3.0]}
    assert keys.dtype == np.uint64 and values.dtype == np.float32


def test_no_part_files_error_names_the_flag_and_the_shared_volume(tmp_path):
    with pytest.raises(export.ExportError) as exc:
        export.read_saved_table(str(tmp_path), 9)
    msg = str(exc.value)
    assert str(tmp_path) in msg and "--table-dir" in msg
    assert "shared by the pserver and trainer pods" in msg and "ReadWriteMany" in msg
