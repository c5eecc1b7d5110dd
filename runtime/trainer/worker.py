"""One training process on Paddle's dataset path: programs, data, passes, evaluation, and the
table it exports. ``PsWorker`` is a Fleet parameter-server trainer (async,
``runtime.trainer.ps_worker``); ``SingleWorker`` trains the same network alone with a local
embedding table. The batch job (``runtime.trainer.train``) and the continuous job
(``runtime.trainer.online``) drive them through the same methods. Beside it:
``runtime.trainer.program`` (the PS programs), ``runtime.trainer.idmap`` (feasign -> row
maps), ``runtime.trainer.auc`` (AUC from the auc op's buckets), ``runtime.trainer.geo``
(GEO's table at an export point).

A pass: the worker's shard of the input is staged as MultiSlot files
(``runtime.trainer.dataset.stage``), loaded into an ``InMemoryDataset`` once, and each pass
is one ``exe.train_from_dataset`` (``thread_num`` = ``--threads``). Progress lines come from
a thread of this module (``runtime.trainer.passes.PassProgress``, not Paddle's ``FetchHandler``) every
``--log-every-s`` seconds: examples, examples/s, loss and the running AUC of the pass
(Paddle's ``auc`` op buckets, reset every pass). After the pass the bucket counts must add
up to the rows loaded, or the pass failed silently and the worker raises.

Paddle's ``train_from_dataset`` always writes ``<id>_train_desc.prototxt`` into the working
directory (``Executor._dump_debug_info``, unconditional in 3.0.0): a pass runs with the
working directory set to a scratch directory under ``--work-dir`` (a pod's root file system
is read-only) that is removed afterwards. The other Paddle APIs outside the public ones
that the parameter-server trainer uses are listed in ``runtime.trainer.ps_worker``.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from runtime.evaluation import auc
from runtime.trainer import dataset, readers
from runtime.trainer.idmap import Vocab
from runtime.trainer.auc import bucket_auc
from runtime.trainer.passes import PassProgress, PassStats, scratch_cwd
from runtime.trainer.config import TrainConfig

log = logging.getLogger(__name__)

PREDICT_BATCH = 4096
VOCAB_FILE = "vocab.npz"  # a single-process checkpoint's vocabulary (``Vocab.state``)


def _feed(batch: readers.Batch, ids: np.ndarray) -> dict:
    from runtime.trainer import datafeed

    feed = {datafeed.DENSE_VAR: batch.dense}
    v = ids.view(np.int64)
    for i in range(v.shape[1]):
        feed[datafeed.slot_var(i)] = np.ascontiguousarray(v[:, i:i + 1])
    feed[datafeed.LABEL_VAR] = batch.labels.reshape(-1, 1).astype(np.int64)
    return feed


class Worker:
    """The shared part of a training process (see the module docstring). Subclasses build
    ``net`` (``runtime.trainer.model.Net`` with the auc op), ``main`` (the program to
    run), ``test_program`` and ``exe``."""

    who = "worker"
    chief = True
    shard = (0, 1)

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.slots = cfg.slots()
        self.budget = readers.BadLineBudget(cfg.max_bad_lines, cfg.max_bad_fraction)

    # ---- data -------------------------------------------------------------------------
    def id_map(self):
        """uint64[n,S] feasigns -> the ids the program looks up (``None``: the feasigns)."""
        return None

    def eval_ids(self, feasigns: np.ndarray) -> np.ndarray:
        """The ids of ``feasigns`` for prediction (never grows a vocabulary)."""
        return feasigns

    collect_keys = False  # keep the distinct feasigns staged (``keys_seen``)
    keys_seen = None  # uint64[k] sorted: the feasigns staged since ``reset_fed`` (with collect_keys)

    def load(self, files: list[str], keep_rows: bool = False, limit: int | None = None, holdout_every: int = 0):
        """Stages this worker's shard of ``files`` (``dataset.stage``) and loads it: ``(dataset, staged)``."""
        staged = dataset.stage(files, fmt=self.cfg.format, slots=self.slots, parts=self.cfg.threads,
                               shard=self.shard, budget=self.budget, id_map=self.id_map(),
                               work_dir=self.cfg.work_dir, keep_rows=keep_rows, limit=limit,
                               collect_keys=self.collect_keys, holdout_every=holdout_every)
        if staged.ids_seen is not None:
            prev = self.keys_seen if self.keys_seen is not None else np.zeros(0, np.uint64)
            self.keys_seen = dataset.distinct(np.concatenate([prev, staged.ids_seen]))
        t0 = time.monotonic()
        ds = dataset.load(staged, self.net.use_vars, self.cfg.batch_size, self.cfg.threads)
        log.info("%s: %d rows staged in %.1f s, loaded in %.1f s", self.who, staged.rows, staged.seconds,
                 time.monotonic() - t0)
        return ds, staged

    # ---- passes -----------------------------------------------------------------------
    def _reset_auc(self) -> None:
        import paddle

        for v in (self.net.stat_pos, self.net.stat_neg):
            t = paddle.static.global_scope().find_var(v.name).get_tensor()
            t.set(np.zeros(np.array(t).shape, dtype=np.int64), paddle.CPUPlace())

    def _buckets(self) -> tuple[np.ndarray, np.ndarray]:
        import paddle

        scope = paddle.static.global_scope()
        return (np.array(scope.find_var(self.net.stat_pos.name).get_tensor()),
                np.array(scope.find_var(self.net.stat_neg.name).get_tensor()))

    def train_pass(self, ds, label: str, expected_rows: int) -> PassStats:
        """One pass over ``ds``; ``label`` names it in the logs (e.g. ``pass 1/2``).
        Raises ``RuntimeError`` if fewer than ``expected_rows`` examples were trained."""
        self._reset_auc()
        self._eval_exe = None  # see _predict_exe
        progress = PassProgress({"loss": self.net.last_loss.name, "stat_pos": self.net.stat_pos.name,
                                 "stat_neg": self.net.stat_neg.name}, self.cfg.log_every_s, self.who, label)
        t0 = time.monotonic()
        with scratch_cwd(self.cfg.work_dir), progress:
            self.exe.train_from_dataset(program=self.main, dataset=ds, thread=self.cfg.threads)
        seconds = time.monotonic() - t0
        pos, neg = self._buckets()
        n = int(pos.sum() + neg.sum())
        if n != expected_rows:
            raise RuntimeError(f"{self.who} {label}: trained {n} examples of the {expected_rows} loaded")
        st = PassStats(n, round(seconds, 3), bucket_auc(pos, neg), progress.loss)
        from runtime.metrics.trainer import metrics

        metrics().pass_done(n, seconds, st.train_auc, st.loss)
        log.info("%s %s done: %d examples in %.1f s (%.0f ex/s), train auc %.4f", self.who, label, n,
                 seconds, st.examples_per_s, st.train_auc)
        return st

    # ---- evaluation -------------------------------------------------------------------
    def _predict_exe(self):
        """An executor for predictions, new after every pass: in Paddle 3.0.0 a pass
        (``train_from_dataset``) drops the child scopes of the global scope, which an
        executor's cached ``run`` program still refers to, and the next ``run`` crashes
        (segfault, or "Variable Id ... is not registered")."""
        if getattr(self, "_eval_exe", None) is None:
            import paddle

            self._eval_exe = paddle.static.Executor(paddle.CPUPlace())
        return self._eval_exe

    def predict(self, batch: readers.Batch) -> np.ndarray:
        """float32[n]: the trained program's click probabilities for ``batch``."""
        out = []
        for s in range(0, len(batch), PREDICT_BATCH):
            b = readers.Batch(batch.labels[s:s + PREDICT_BATCH], batch.dense[s:s + PREDICT_BATCH],
                              batch.feasigns[s:s + PREDICT_BATCH])
            (p,) = self._predict_exe().run(self.test_program, feed=_feed(b, self.eval_ids(b.feasigns)),
                                           fetch_list=[self.net.prob])
            out.append(np.asarray(p).ravel())
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def evaluate(self, batch: readers.Batch) -> tuple[float, np.ndarray]:
        """``(auc, predictions float32[n])`` on ``batch``."""
        p = self.predict(batch)
        return auc(batch.labels, p), p

    # ---- export points (every process of the job calls them, in the same order) --------
    def sync(self) -> None:
        """Makes every worker's updates visible before a save or an evaluation."""

    def full_table(self, save_dir: str, exact: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole table (``keys uint64[n]``, ``values float32[n, dim]``) on the chief,
        ``None`` elsewhere. ``save_dir``: a fresh directory the save may use. ``exact``:
        the values the table holds bit for bit (parameter servers: pulled, not the save's
        6-digit text)."""
        raise NotImplementedError

    def reset_fed(self) -> None:
        """Forgets the feasigns fed so far (``keys_seen``): called at every export point."""
        self.keys_seen = np.zeros(0, np.uint64)

    def fed_rows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows of every feasign any worker fed since ``reset_fed`` (``keys uint64[k]``
        sorted, ``values float32[k, dim]`` as the table holds them now) on the chief, ``None``
        elsewhere: a patch's rows (``runtime.trainer.fedrows``). Every process calls it."""
        raise NotImplementedError

    def local_table(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole table when this process holds it in memory (single process), else
        ``None`` (parameter servers: only a save reads it)."""
        return None

    def shrink(self, directory: str, decay: float, unseen_limit: int | None) -> tuple[np.ndarray, dict] | None:
        """A shrink point of the feature lifecycle (``runtime.trainer.lifecycle``): counts
        times ``decay``, rows unfed for more than ``unseen_limit`` shrink points evicted
        (None: none), then every row's unseen count ticked. ``directory``: a fresh directory
        the table may be saved into. Every process calls it, in the same order. Returns on
        the chief ``(keys uint64[t], rows per pserver {index: count})``: the table's keys
        after the shrink (admitted or not); ``None`` elsewhere."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Waits for every worker of the job (one process: returns)."""

    def checkpoint(self, directory: str) -> None:
        """Saves everything training needs to go on (parameters and optimizer state) under
        ``directory`` (every process of the job calls it, in the same order)."""
        raise NotImplementedError

    def restore(self, directory: str) -> str | None:
        """Loads a ``checkpoint`` (every process of the job calls it). Raises ``RuntimeError``
        naming the directory when it is not a complete checkpoint. Returns the table layout
        change when the checkpoint was written by another one (``"pservers 1 -> 2"``: the
        next export must then be a base), else ``None``."""
        raise NotImplementedError

    def close(self) -> None:
        """Leaves the job (parameter servers: stops this worker's client)."""


class SingleWorker(Worker):
    """The network with a local embedding table over ``Vocab`` (row 0 = the default row,
    zeros: a feasign not admitted), ``Adam(lazy_mode=True)``; no parameter server. The
    feature lifecycle is the vocabulary's (``Vocab``); a row freed by an eviction is
    re-initialised (uniform values, zero Adam moments) before it is reused."""

    who = "single"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        import paddle

        from runtime.trainer import model

        paddle.enable_static()
        paddle.seed(cfg.seed)
        self.net = model.build_train(len(self.slots), cfg.embedding_dim, tuple(cfg.layers), ps=False,
                                     vocab_size=cfg.single_vocab_size)
        self.test_program = self.net.main.clone(for_test=True)
        model.add_auc(self.net)
        with paddle.static.program_guard(self.net.main, self.net.startup):
            paddle.optimizer.Adam(cfg.lr, lazy_mode=True).minimize(self.net.loss)
        self.main = self.net.main
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        self.exe.run(self.net.startup)
        self.vocab = Vocab(cfg.single_vocab_size, cfg.feature_min_count)
        self._rng = np.random.default_rng(cfg.seed)
        self.collect_keys = cfg.mode == "continuous"  # a patch = the rows fed (runtime.trainer.fedrows)

    def id_map(self):
        return self.vocab

    def eval_ids(self, feasigns: np.ndarray) -> np.ndarray:
        return self.vocab(feasigns, grow=False)

    def table_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys uint64[m], values float32[m, dim]) of every feasign admitted."""
        keys, rows = self.vocab.items()
        return keys, self._table()[rows].astype(np.float32)

    def _table(self) -> np.ndarray:
        import paddle

        from runtime.trainer import model

        return np.array(paddle.static.global_scope().find_var(model.TABLE_NAME).get_tensor())

    def shrink(self, directory: str, decay: float, unseen_limit: int | None) -> tuple[np.ndarray, dict]:
        """``Vocab.shrink``; the freed rows get fresh uniform values and zero Adam moments."""
        import paddle

        from runtime.trainer import model

        freed = self.vocab.shrink(decay, unseen_limit)
        if len(freed):
            scope = paddle.static.global_scope()
            for var in self.main.list_vars():
                if not var.persistable or not var.name.startswith(model.TABLE_NAME):
                    continue
                t = scope.find_var(var.name).get_tensor()
                a = np.array(t)
                if a.ndim != 2 or a.shape[0] != self.cfg.single_vocab_size:
                    continue  # the beta powers: one per parameter, not per row
                a[freed] = (self._rng.uniform(-model.INIT_RANGE, model.INIT_RANGE, (len(freed), a.shape[1]))
                            if var.name == model.TABLE_NAME else 0.0)
                t.set(a, paddle.CPUPlace())
        known = self.vocab.known()
        return known, {0: len(known)}

    def full_table(self, save_dir: str, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return self.table_rows()

    local_table = table_rows

    def fed_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The fed feasigns' rows of the local table (bit for bit what it holds)."""
        import paddle

        from runtime.trainer import fedrows, model

        keys = fedrows.gather_keys(self)
        table = np.array(paddle.static.global_scope().find_var(model.TABLE_NAME).get_tensor())
        rows = self.vocab(keys.reshape(-1, 1), grow=False).ravel().astype(np.int64)
        values = table[rows].astype(np.float32)
        values[rows == 0] = 0.0  # not admitted: the default row (the program reads row 0 as zeros: padding_idx)
        return keys, values

    def checkpoint(self, directory: str) -> None:
        """``paddle.static.save`` of the training program (table, head, Adam moments) as
        ``directory/model.*`` and the vocabulary with its counts as ``directory/vocab.npz``
        (``Vocab.state``)."""
        import paddle

        os.makedirs(directory, exist_ok=True)
        paddle.static.save(self.main, os.path.join(directory, "model"))
        np.savez(os.path.join(directory, VOCAB_FILE), **self.vocab.state())

    def restore(self, directory: str) -> None:
        import paddle

        for name in ("model.pdparams", VOCAB_FILE):
            if not os.path.exists(os.path.join(directory, name)):
                raise RuntimeError(f"checkpoint {directory}: no {name} (not a single-process checkpoint of this "
                                   "trainer; start from a new --state-dir)")
        paddle.static.load(self.main, os.path.join(directory, "model"), self.exe)
        with np.load(os.path.join(directory, VOCAB_FILE)) as z:
            self.vocab.restore(z)
        self._eval_exe = None
