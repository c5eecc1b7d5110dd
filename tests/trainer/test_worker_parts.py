"""Pieces of the dataset path that need no training: the auc op's bucket AUC, the client
push flags written through ctypes, the GEO row hash, the config checks of the new flags."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from runtime import role_specs
from runtime.evaluation import auc
from runtime.trainer import config as tconfig, input_checks
from runtime.trainer.idmap import geo_rows
from runtime.trainer.auc import bucket_auc


def test_bucket_auc_matches_rank_auc():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 20000)
    p = 1 / (1 + np.exp(-(rng.standard_normal(20000) + 1.2 * (2 * y - 1))))
    T = 4095
    b = np.floor(p * T).astype(int)
    pos = np.bincount(b[y == 1], minlength=T + 1)[None, :]
    neg = np.bincount(b[y == 0], minlength=T + 1)[None, :]
    assert bucket_auc(pos, neg) == pytest.approx(auc(y, p), abs=2e-4)
    assert np.isnan(bucket_auc(pos, np.zeros_like(neg)))


def test_geo_rows_stay_in_range_and_skip_zero():
    f = geo_rows(1000)
    ids = f(np.arange(0, 50000, dtype=np.uint64).reshape(-1, 2) * np.uint64(7919))
    assert ids.min() >= 1 and ids.max() <= 999 and ids.dtype == np.uint64


_FLAGS_SCRIPT = """
import json
from runtime.trainer import psflags
before = psflags.read()
changed = psflags.apply()
print(json.dumps({"before": before, "after": psflags.read(), "changed": changed}))
"""


def test_psflags_are_written_in_the_process():
    out = subprocess.run([sys.executable, "-c", _FLAGS_SCRIPT], capture_output=True, text=True, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    from runtime.trainer.psflags import CLIENT_PUSH_FLAGS

    assert rec["before"] == {k: d for k, (d, _) in CLIENT_PUSH_FLAGS.items()}
    assert rec["after"] == {k: v for k, (_, v) in CLIENT_PUSH_FLAGS.items()}


def _cfg(tmp_path, **kw):
    data = tmp_path / "train.txt"
    data.write_text("")
    base = {} if "data_root" in kw or kw.get("mode") == "continuous" else dict(data_train=[str(data)])
    base.update(kw)
    return tconfig.TrainConfig(**base)


@pytest.mark.parametrize("kw, needle", [
    (dict(ps_mode="sync"), "--ps-mode"),
    (dict(mode="online"), "--mode"),
    (dict(threads=0), "--threads"),
    (dict(mode="continuous"), "--data-root"),
    (dict(mode="continuous", data_root="/d", start_hour="20261120/00"), "--state-dir"),
    (dict(data_root="/d", start_hour="20261120/00"), "--end-hour"),
    (dict(data_root="/d", start_hour="20261120/05", end_hour="20261120/01"), "before --start-hour"),
    (dict(start_hour="20261120/05"), "need --data-root"),
    (dict(data_root="/d", start_hour="2026-11-20"), "YYYYMMDD/HH"),
    (dict(mode="continuous", data_root="/d", start_hour="20261120/0001", state_dir="/s", partition_minutes=60),
      "--start-hour '20261120/0001' is invalid; allowed: a partition of --partition-minutes"),
    (dict(mode="continuous", ps_mode="geo", data_root="/d", start_hour="20261120/00", state_dir="/s"), "geo"),
])
def test_config_errors_name_the_flag(tmp_path, kw, needle):
    with pytest.raises(ValueError, match=needle):
        input_checks.check_inputs(_cfg(tmp_path, **kw))


def test_train_argv_roundtrips_new_flags(tmp_path):
    from runtime.cli import build_parser

    cfg = _cfg(tmp_path, threads=2, ps_mode="geo", geo_k_steps=7, geo_table_rows=1234, work_dir="/w")
    args = build_parser().parse_args(role_specs.train_argv(cfg))
    again = tconfig.config_from_args(args)
    for k in ("threads", "ps_mode", "geo_k_steps", "geo_table_rows", "work_dir", "mode"):
        assert getattr(again, k) == getattr(cfg, k), k


def test_distinct_equals_numpy_unique():
    from runtime.trainer.dataset import distinct

    rng = np.random.default_rng(3)
    a = rng.integers(0, 1 << 63, (5000, 26), dtype=np.uint64)
    a[::7] = a[1::7][: len(a[::7])]  # repeated rows
    got = distinct(a)
    assert got.dtype == np.uint64 and np.array_equal(got, np.unique(a))
    assert distinct(np.zeros(0, np.uint64)).shape == (0,)
    assert distinct(np.array([[5]], np.uint64)).tolist() == [5]
    seen = distinct(a[:100])
    assert np.array_equal(distinct(np.concatenate([seen, distinct(a[50:])])), np.unique(a))


class _Lines(logging.Handler):
    """The messages logged to the logger it is added to."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def worker_lines():
    """The lines ``runtime.trainer.worker`` logs during the test, wherever an earlier test
    left the logging configuration (a ``dictConfig`` disables existing loggers, a level
    above INFO)."""
    lg = logging.getLogger("runtime.trainer.worker")
    saved = (lg.level, lg.disabled)
    h = _Lines()
    lg.setLevel(logging.INFO)
    lg.disabled = False
    lg.addHandler(h)
    try:
        yield h
    finally:
        lg.removeHandler(h)
        lg.setLevel(saved[0])
        lg.disabled = saved[1]


def test_pass_progress_reads_the_scope_logs_and_stops_at_once(worker_lines):
    """The progress thread of a pass (``PassProgress``, in place of Paddle's FetchHandler,
    whose stop could wait without bound): it logs lines from the variables of the global
    scope while the block runs, its last reading gives the loss, and leaving the block does
    not wait for the period."""
    import time

    from runtime.inference import import_paddle
    from runtime.trainer.passes import PassProgress

    paddle = import_paddle()
    scope = paddle.static.global_scope()
    names = {"loss": "test_progress_loss", "stat_pos": "test_progress_pos", "stat_neg": "test_progress_neg"}
    pos = np.zeros((1, 4096), np.int64)
    neg = np.zeros((1, 4096), np.int64)
    pos[0, 3000], neg[0, 1000] = 30, 70

    def put(name, value):
        scope.var(name).get_tensor().set(value, paddle.CPUPlace())

    put(names["stat_pos"], pos)
    put(names["stat_neg"], neg)
    put(names["loss"], np.array([0.5], np.float32))
    with PassProgress(names, 0.1, "trainer-0", "pass 1/1") as progress:
        deadline = time.monotonic() + 10
        while "examples 100 |" not in worker_lines.text and time.monotonic() < deadline:
            time.sleep(0.05)
        put(names["loss"], np.array([0.25], np.float32))
    assert "trainer-0 pass 1/1 examples 100 |" in worker_lines.text and "running auc 1.0000" in worker_lines.text
    assert progress.loss == 0.25  # the reading taken on leaving the block

    t0 = time.monotonic()
    with PassProgress(names, 30.0, "trainer-0", "pass 2/2") as slow:
        time.sleep(0.1)
    assert time.monotonic() - t0 < 5.0, "leaving the block waited for the period"
    assert not slow._thread.is_alive()

    missing = PassProgress({"loss": "test_progress_absent", "stat_pos": "test_progress_absent2",
                            "stat_neg": names["stat_neg"]}, 0.1, "trainer-0", "pass 3/3")
    got_pos, got_neg = missing.read()
    assert got_pos is None and np.array_equal(got_neg, neg) and np.isnan(missing.loss)
    missing.log(got_pos, got_neg)  # no line without both bucket arrays
    assert "pass 3/3" not in worker_lines.text
