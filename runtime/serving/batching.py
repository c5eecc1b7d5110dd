"""Dynamic batching for serving's models: concurrent requests to one model combined into
one run (as Triton's dynamic batcher), with no timer and no extra thread.

Generic: a request is a tuple of numpy arrays with the same number of rows (axis 0); a
batch is their row-wise concatenation, and a run's output is split back by rows.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np


class _Job:
    __slots__ = ("arrays", "n", "event", "result", "error", "lead")

    def __init__(self, arrays: tuple[np.ndarray, ...]):
        self.arrays, self.n = arrays, arrays[0].shape[0]
        self.event: threading.Event | None = None  # made only for a request that queues
        self.result = self.error = None
        self.lead = False


class Combiner:
    """Combines concurrent requests into one run of ``process`` (dynamic batching): a run's
    fixed cost (for serving's CTR model, a predictor run and a cube round trip) is paid once
    per combined batch instead of once per request.

    A request that finds fewer than ``max_active`` batches in flight runs at once with
    whatever requests are queued (up to ``max_rows`` rows in all); the others queue, and
    when a batch finishes the oldest queued request leads the next one. A lone request is
    never delayed. A caller that needs all requests of a batch to see the same state (one
    model version) makes one ``Combiner`` per state.

    Args:
        process: ``(*arrays) -> out``: arrays with n rows each (axis 0) -> an array with
            n rows; called with the row-wise concatenation of a batch's requests.
        max_rows: most rows combined into one run (a larger lone request still runs).
        max_active: batches run at the same time.
    """

    def __init__(self, process: Callable[..., np.ndarray], max_rows: int, max_active: int = 1):
        self.process = process
        self.max_rows = max_rows
        self.max_active = max_active
        self.lock = threading.Lock()
        self.pending: list[_Job] = []
        self.active = 0
        self.batches = 0
        self.requests = 0

    def submit(self, *arrays: np.ndarray) -> np.ndarray:
        """``arrays``: n rows each -> this request's rows of ``process``'s output (n rows).
        Raises what ``process`` raised for its batch (every request of the batch gets it)."""
        job = _Job(arrays)
        with self.lock:
            if self.active < self.max_active:
                self.active += 1
                job.lead = True
            else:
                job.event = threading.Event()
                self.pending.append(job)
        if not job.lead:
            job.event.wait()
        if job.lead and job.result is None and job.error is None:
            self._run(job)
        if job.error is not None:
            raise job.error
        return job.result

    def _run(self, me: _Job) -> None:
        batch, rows = [me], me.n
        with self.lock:
            while self.pending and rows + self.pending[0].n <= self.max_rows:
                j = self.pending.pop(0)
                batch.append(j)
                rows += j.n
        try:
            if len(batch) == 1:
                me.result = self.process(*me.arrays)
            else:
                out = self.process(*(np.concatenate([j.arrays[k] for j in batch]) for k in range(len(me.arrays))))
                off = 0
                for j in batch:
                    j.result = out[off:off + j.n]
                    off += j.n
        except BaseException as exc:  # every request of the batch gets the error
            for j in batch:
                j.error = exc
        self.batches += 1
        self.requests += len(batch)
        nxt = None
        with self.lock:
            if self.pending:
                nxt = self.pending.pop(0)
                nxt.lead = True  # leadership (and the active slot) passes on
            else:
                self.active -= 1
        for j in batch[1:]:
            j.event.set()
        if nxt is not None:
            nxt.event.set()
