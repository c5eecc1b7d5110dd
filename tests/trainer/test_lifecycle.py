"""The feature lifecycle's pieces (runtime.trainer.lifecycle, served, idmap.Vocab): settings to
the accessor's parameters and the shrink points' cadence, the rows an export publishes
(admission, deletions of evicted keys), and the single process's vocabulary doing what the
parameter servers do (admission by count, decay, eviction after the time to live, rows reused)."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.role_specs import train_argv
from runtime.trainer.config import TrainConfig, TrainConfigError
from runtime.trainer.idmap import Vocab
from runtime.trainer.lifecycle import NEVER, Lifecycle, lifecycle_argv
from runtime.trainer.served import ServedKeys

ROOT = ["--data-train", "x"]


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(data_train=["x"], **kw)


def test_ttl_and_half_life_become_the_accessors_eviction_and_decay():
    life = Lifecycle.of(_cfg(feature_min_count=3, feature_ttl_hours=6, feature_count_half_life_hours=12,
                             shrink_every_minutes=60))
    # evicted at the 6th shrink point after the last feeding: unseen_days 0..5 survive
    assert (life.min_count, life.period_minutes, life.unseen_limit) == (3, 60, 5)
    assert life.decay == pytest.approx(0.5 ** (1 / 12)) and life.evicts and life.shrinks
    assert life.ttl_minutes == 7 * 60  # at the latest: one period more than the ttl
    acc = life.accessor_configs("table_parameters.T")
    assert acc == {"table_parameters.T.accessor.embedx_threshold": 3,
                   "table_parameters.T.accessor.ctr_accessor_param.nonclk_coeff": 1.0,
                   "table_parameters.T.accessor.ctr_accessor_param.click_coeff": 1.0,
                   "table_parameters.T.accessor.ctr_accessor_param.show_click_decay_rate": life.decay,
                   "table_parameters.T.accessor.ctr_accessor_param.delete_threshold": 0.0,
                   "table_parameters.T.accessor.ctr_accessor_param.delete_after_unseen_days": 5.0}
    off = Lifecycle.of(_cfg(feature_min_count=1, feature_ttl_hours=0))
    assert off.unseen_limit is None and off.decay == 1.0 and not off.shrinks and not off.evicts
    assert off.accessor_configs("p")["p.accessor.ctr_accessor_param.delete_after_unseen_days"] == NEVER
    # a ttl that is not a whole number of periods rounds up: 90 minutes at 60 -> 2 periods
    assert Lifecycle.of(_cfg(feature_ttl_hours=1.5, shrink_every_minutes=60)).unseen_limit == 1
    # the defaults: a day at a shrink point every 4 hours
    assert (Lifecycle.of(_cfg()).min_count, Lifecycle.of(_cfg()).unseen_limit) == (3, 5)
    assert Lifecycle.of(_cfg(feature_ttl_hours=2, shrink_every_minutes=120)).unseen_limit == 0


def test_shrink_points_follow_trained_data_time():
    life = Lifecycle.of(_cfg(feature_ttl_hours=2, shrink_every_minutes=60))
    assert not life.shrink_due(0, 60) and life.shrink_due(1, 60)
    assert [life.shrink_due(n, 5) for n in (11, 12, 13)] == [False, True, True]  # 1-minute..5-minute partitions
    assert not Lifecycle.of(_cfg(feature_ttl_hours=0)).shrink_due(100, 60)  # nothing to shrink


def test_ttl_shorter_than_a_shrink_period_is_refused_naming_both_flags():
    with pytest.raises(TrainConfigError) as exc:
        _cfg(feature_ttl_hours=0.5, shrink_every_minutes=60)
    assert "--feature-ttl-hours 0.5 is invalid" in str(exc.value) and "--shrink-every-minutes" in str(exc.value)
    with pytest.raises(TrainConfigError, match="--feature-min-count"):
        _cfg(feature_min_count=0)


def test_lifecycle_flags_only_when_they_differ_and_round_trip():
    assert lifecycle_argv(_cfg()) == []
    cfg = _cfg(feature_min_count=4, feature_ttl_hours=12, shrink_every_minutes=30, feature_count_half_life_hours=48)
    assert lifecycle_argv(cfg) == ["--feature-min-count", "4", "--feature-ttl-hours", "12.0",
                                   "--shrink-every-minutes", "30", "--feature-count-half-life-hours", "48.0"]
    argv = train_argv(cfg)
    pairs = dict(zip(argv[::1], argv[1::1]))
    assert pairs["--feature-ttl-hours"] == "12.0" and pairs["--feature-min-count"] == "4"


def _rows(keys, zero=()):
    v = np.arange(1, 3 * len(keys) + 1, dtype=np.float32).reshape(-1, 3)
    for k in zero:
        v[list(keys).index(k)] = 0.0
    return np.array(keys, np.uint64), v


def test_served_keys_a_base_leaves_out_feasigns_not_admitted():
    s = ServedKeys()
    k, v = s.cut(*_rows([5, 3, 9], zero=[9]), base=True)
    assert k.tolist() == [3, 5] and v.any(axis=1).all()
    s.published(k, v, True)
    assert s.keys.tolist() == [3, 5] and (s.admitted, s.deleted) == (2, 0)


def test_served_keys_a_patch_deletes_evicted_keys_and_only_keys_of_the_chain():
    s = ServedKeys()
    s.published(*_rows([1, 2, 3, 4]), True)
    # a shrink point: the table lost 2 and 4 (evicted) and 9 (never served)
    assert s.evicted(np.array([1, 3, 7], np.uint64)) == 2
    # the next patch fed 3 (admitted: a row), 7 (not admitted: zeros) and 4 (evicted, fed once again: zeros)
    k, v = s.cut(*_rows([3, 7, 4], zero=[7, 4]), base=False)
    assert k.tolist() == [2, 3, 4]  # 2 and 4 deleted (zero rows), 3 updated; 7 was never served
    assert (~v[[0, 2]].any(axis=1)).all() and v[1].any()
    s.published(k, v, False)
    assert s.keys.tolist() == [1, 3] and (s.admitted, s.deleted) == (0, 2) and len(s.pending) == 0
    k, v = s.cut(*_rows([8, 1]), base=False)  # 8 admitted now
    s.published(k, v, False)
    assert s.keys.tolist() == [1, 3, 8] and (s.admitted, s.deleted) == (1, 0)


def test_served_keys_unknown_after_a_restart_keep_every_zero_row_of_a_patch():
    s = ServedKeys()
    assert s.evicted(np.array([1], np.uint64)) == 0
    k, _ = s.cut(*_rows([4, 2], zero=[2]), base=False)
    assert k.tolist() == [2, 4]  # 2 may be held by the cube: its deletion is kept
    s.published(*s.cut(*_rows([4, 2], zero=[2]), base=False), False)
    assert s.keys is None


def test_admission_single_vocab_counts_feasigns_and_admits_at_the_minimum():
    vocab = Vocab(100, min_count=2)
    batch = np.array([[5, 6], [5, 7]], np.uint64)
    rows = vocab(batch)
    assert rows[:, 0].tolist() == [1, 1] and rows[:, 1].tolist() == [0, 0]  # 5 fed twice: admitted
    assert vocab(np.array([[6]], np.uint64)).item() == 2  # 6's second time
    assert vocab(np.array([[7]], np.uint64), grow=False).item() == 0  # an evaluation counts nothing
    assert vocab(np.array([[7]], np.uint64)).item() == 3
    assert sorted(vocab.items()[0].tolist()) == [5, 6, 7] and len(vocab.known()) == 3


def test_evict_single_vocab_after_the_ttl_reuses_rows_and_decays_counts():
    vocab = Vocab(100, min_count=2)
    vocab(np.array([[1, 1, 2, 3, 3]], np.uint64).T)  # 1, 3 admitted; 2 counted
    assert vocab.shrink(0.5, unseen_limit=1).tolist() == []  # first point: all just fed
    vocab(np.array([[3]], np.uint64))  # 3 fed again
    assert vocab.shrink(0.5, unseen_limit=1).tolist() == []  # 1, 2 unseen 1: kept
    freed = vocab.shrink(0.5, unseen_limit=1)  # 1, 2 unseen 2 > 1: evicted; 3 unseen 1
    assert freed.tolist() == [1] and sorted(vocab.known().tolist()) == [3]
    assert vocab.counts[3] == pytest.approx((2 * 0.5 + 1) * 0.5 * 0.5)
    assert vocab(np.array([[9, 9]], np.uint64).T).tolist() == [[1], [1]], "an evicted row is reused"
    st = vocab.state()
    again = Vocab(100, min_count=2)
    again.restore(st)
    assert again.index == vocab.index and again.counts == vocab.counts and again.free == vocab.free
    assert again.next_row == vocab.next_row
