"""The continuous job's shrink points (``runtime.trainer.lifecycle``): every
``--shrink-every-minutes`` of trained data, every process of the job decays the feasign
counts, evicts the rows unfed past the time to live and ticks the others' unseen counts
(``Worker.shrink``); trainer 0 then knows the table's keys, so every key of the served
chain that is gone is deleted by the next export (``runtime.trainer.served``).

The clock is trained data: partitions trained (a quarantined partition is not, so a run of
broken data evicts nothing), counted by every process alike, restarted from the count the
last checkpoint was taken at (``OnlineState.checkpoint_since_shrink``): a job restored from
a checkpoint replays the shrink points that followed it at the same partitions.

Trainer 0 also counts the rows each shrink point evicted: the table's keys after the
previous one, with every feasign fed since (every trainer's, gathered like a patch's:
``fedrows.gather_keys``), are the keys before this one; after a (re)start the first count
is not known.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import numpy as np

from runtime.trainer import fedrows, publish
from runtime.trainer.dataset import distinct
from runtime.trainer.lifecycle import Lifecycle
from runtime.trainer.served import ServedKeys

log = logging.getLogger(__name__)


class ShrinkPoints:
    """One process's side of the shrink points (module docstring). ``since``: partitions
    trained since the last shrink point (the clock); ``fed``: uint64[k] sorted, the
    feasigns this process fed since then; trainer 0: ``table_keys`` (uint64[t] sorted, the
    table's keys after the last shrink point, None before the first of this run)."""

    def __init__(self, worker, cfg, since: int = 0):
        self.worker, self.cfg = worker, cfg
        self.life = Lifecycle.of(cfg)
        self.since = int(since)
        self.fed = np.zeros(0, np.uint64)
        self.table_keys: Optional[np.ndarray] = None
        if self.life.decay < 1.0 and worker.chief:
            log.warning("%s: feature counts decay (--feature-count-half-life-hours %g): a row whose decayed count "
                        "falls below --feature-min-count %d keeps its embedding on the parameter servers but "
                        "leaves the served table (the accessor saves embedx only at or above the threshold), so "
                        "serving answers zeros for it until its count is back (docs/training.md, Choosing the "
                        "settings)", worker.who, cfg.feature_count_half_life_hours, self.life.min_count)

    def trained(self, fed: Optional[np.ndarray]) -> None:
        """A partition was trained; ``fed``: its distinct feasigns on this process (uint64[m]
        sorted, or None when not collected)."""
        self.since += 1
        if fed is not None and self.life.shrinks:
            self.fed = distinct(np.concatenate([self.fed, fed]))

    def due(self) -> bool:
        """Whether a shrink point is due now (trainer 0's answer on every process)."""
        if not self.life.shrinks:  # the same settings on every process: nothing to agree on
            return False
        due = self.life.shrink_due(self.since, self.cfg.partition_minutes)
        return bool(fedrows.agree(self.worker, int(due)))

    def run(self, served: Optional[ServedKeys]) -> Optional[dict]:
        """The shrink point (every process, in the same order). Returns trainer 0's record
        ``{"seconds", "table_rows", "evicted", "deleted"}`` (``deleted``: keys of the served
        chain now pending deletion), ``None`` elsewhere."""
        from runtime.metrics.trainer import metrics

        t0 = time.monotonic()
        with publish.table_save_dir(self.cfg.table_dir) as directory:
            out = self.worker.shrink(directory, self.life.decay, self.life.unseen_limit)
        fed = fedrows.gather_keys(self.worker, "shrink point", keys=self.fed)
        self.since, self.fed = 0, np.zeros(0, np.uint64)
        if not self.worker.chief:
            return None
        keys, rows = out
        keys = np.sort(keys)
        evicted = None
        if self.table_keys is not None:
            evicted = int(len(np.union1d(self.table_keys, fed)) - len(keys))
        self.table_keys = keys
        deleted = served.evicted(keys) if served is not None else 0
        seconds = time.monotonic() - t0
        metrics().shrink_done(rows, evicted, seconds)
        log.info("%s: shrink point: %d rows in the table (%s evicted), %d served keys to delete, %.1f s",
                 self.worker.who, len(keys), "n/a" if evicted is None else evicted, deleted, seconds)
        return {"seconds": round(seconds, 3), "table_rows": int(len(keys)), "evicted": evicted, "deleted": deleted}
