"""What one training pass reports and how it runs around Paddle's ``train_from_dataset``:
``PassStats`` (its figures), ``PassProgress`` (progress lines from a thread while it runs)
and ``scratch_cwd`` (the scratch working directory Paddle's debug dump needs). Used by
``runtime.trainer.worker``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from runtime.trainer.auc import bucket_auc

log = logging.getLogger("runtime.trainer.worker")


@dataclass
class PassStats:
    """One ``train_from_dataset`` pass: ``examples`` trained (from the auc op's buckets),
    ``seconds`` (wall), ``train_auc`` (over the pass), ``loss`` (the last reported)."""

    examples: int
    seconds: float
    train_auc: float
    loss: float

    @property
    def examples_per_s(self) -> float:
        return self.examples / max(self.seconds, 1e-9)


class PassProgress:
    """Progress lines while a pass runs: a thread reads the loss and the ``auc`` op's
    buckets from the global scope every ``period_s`` (s) and logs examples, examples/s, loss
    and the running AUC; leaving the block stops the thread (at once) and takes a last
    reading, so ``loss`` is the pass's last loss.

    Why not Paddle's ``FetchHandler`` (``train_from_dataset(fetch_handler=...)``): its
    monitor thread (``paddle.base.trainer_factory.FetchHandlerMonitor``, 3.0.0) sleeps 1 s
    holding its lock and takes the lock again right after releasing it, so the
    ``stop()`` that ``train_from_dataset`` calls after the pass waits until a release
    happens to reach the waiting thread first: seconds at the end of a pass, or without
    bound on an idle machine (a continuous job hung after its second partition's pass, both
    threads idle, for minutes; the same loop alone starved a waiter 10 s in 3 runs of 8).
    The variables are read the way that monitor reads them (a tensor of the scope, from
    another thread while the pass writes it); ``loss`` and the buckets are persistable, so
    they live in the global scope the training threads write.

    Args:
        names: ``{"loss": var, "stat_pos": var, "stat_neg": var}``: the variables' names.
        period_s: seconds between two lines (>= 0.1).
        who, label: name the process and the pass in the lines.
    """

    def __init__(self, names: dict[str, str], period_s: float, who: str, label: str):
        self.names, self.period_s = names, max(0.1, float(period_s))
        self.who, self.label = who, label
        self.loss = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{label}", daemon=True)
        self.t_last, self.n_last = time.monotonic(), 0

    def __enter__(self) -> "PassProgress":
        self.t_last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read_loss()  # the pass's last loss (the worker reads the buckets itself)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.log(*self.read())
            except Exception:  # noqa: BLE001 - a progress line never fails the pass
                log.debug("%s %s: progress not readable", self.who, self.label, exc_info=True)

    def _tensor(self, key: str) -> Optional[np.ndarray]:
        """The variable ``names[key]`` of the global scope as it is now (None: absent or
        not initialized yet)."""
        import paddle

        var = paddle.static.global_scope().find_var(self.names[key])
        t = var.get_tensor() if var is not None else None
        return np.array(t) if t is not None and t._is_initialized() else None

    def _read_loss(self) -> None:
        loss = self._tensor("loss")
        if loss is not None and loss.size:
            self.loss = float(loss.ravel()[0])

    def read(self) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """``(stat_pos, stat_neg)`` int64 bucket counts as they are now (None where not
        initialized yet); updates ``loss``."""
        self._read_loss()
        return self._tensor("stat_pos"), self._tensor("stat_neg")

    def log(self, pos: Optional[np.ndarray], neg: Optional[np.ndarray]) -> None:
        """One progress line from the buckets ``read`` returned (none while either is None)."""
        if pos is None or neg is None:
            return
        n = int(pos.sum() + neg.sum())
        now = time.monotonic()
        rate = (n - self.n_last) / max(now - self.t_last, 1e-9)
        self.t_last, self.n_last = now, n
        log.info("%s %s examples %d | %.0f ex/s | loss %.4f | running auc %.4f", self.who, self.label,
                 n, rate, self.loss, bucket_auc(pos, neg))


@contextlib.contextmanager
def scratch_cwd(parent: str | None):
    """Runs the block in a fresh directory under ``parent`` (default: the temp dir), then
    restores the working directory and removes the scratch one (``runtime.trainer.worker``'s docstring says why)."""
    prev = os.getcwd()
    scratch = tempfile.mkdtemp(prefix="elastic-ctr-pass-", dir=parent)
    os.chdir(scratch)
    try:
        yield
    finally:
        os.chdir(prev)
        shutil.rmtree(scratch, ignore_errors=True)
