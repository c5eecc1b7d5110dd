"""``elastic-ctr train``: Fleet parameter-server training (async), or single-process.

Parameter-server mode (Paddle 3.0.0, legacy static graph ``FLAGS_enable_pir_api=0``):
the role (pserver or trainer) comes from the environment (``runtime.trainer.roles``).
A pserver serves the sparse table and the dense parameters until it is stopped (it never
exits by itself: Volcano's ``CompleteJob`` policy or the local-cluster launcher stops it).
A trainer waits for every pserver port, runs ``fleet.init_worker()``, trains ``epochs``
passes over its shard of the training lines (``a_sync=True``, Adam), logs progress, and
trainer 0 evaluates the test AUC after each pass. At the end every trainer calls the
fleet save (it holds a barrier); trainer 0 then exports the version
(``runtime.trainer.export``).

The sparse table is saved by the PSERVERS, into the directory trainer 0 names, on the
pservers' own file system; trainer 0 then reads it back. That directory is a fresh
subdirectory of ``--table-dir`` (default: the system temp dir), removed after the export.
On one machine any local directory works; in Kubernetes ``--table-dir`` must be a volume
shared by the pserver and trainer pods (ReadWriteMany), mounted at the same path in both.

Single-process mode (``--single``): the same network with a local embedding table over a
vocabulary grown on the fly (feasign -> row; row 0 = zero vector for unseen feasigns),
same data, same export.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
import numpy as np

from runtime.evaluation import auc
from runtime.trainer import readers, roles
from runtime.trainer.config import TABLE_DIR_PREFIX, TrainConfig, check_inputs, check_table_dir

log = logging.getLogger(__name__)


@contextlib.contextmanager
def table_save_dir(base: str | None) -> Iterator[str]:
    """A fresh, empty directory for one ``fleet.save_one_table`` (``<base>/elastic-ctr-table-XXXX``),
    removed with its contents when the block exits (also on an exception).

    Args:
        base: the ``--table-dir`` (created if missing); ``None`` or ``""`` = the system temp
            dir. The pservers write the part files into the directory on THEIR file system,
            so in Kubernetes ``base`` must be on a volume shared (ReadWriteMany) by the
            pserver and trainer pods, mounted at the same path.

    Raises:
        ValueError: ``base`` cannot be created or written (names ``--table-dir``).
    """
    if base:
        check_table_dir(base)
    path = tempfile.mkdtemp(prefix=TABLE_DIR_PREFIX, dir=base or None)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _feed(batch: readers.Batch, with_label: bool = True) -> dict:
    ids = batch.feasigns.view(np.int64)
    feed = {"dense_input": batch.dense}
    for i in range(ids.shape[1]):
        feed[f"C{i + 1}"] = np.ascontiguousarray(ids[:, i:i + 1])
    if with_label:
        feed["label"] = batch.labels.reshape(-1, 1)
    return feed


class Progress:
    """Periodic progress line: pass, batch, examples/s, loss, running AUC (last 20k rows)."""

    def __init__(self, who: str, epochs: int, every_s: float):
        self.who, self.epochs, self.every_s = who, epochs, every_s
        self.labels: deque = deque(maxlen=40)
        self.probs: deque = deque(maxlen=40)
        self.losses: deque = deque(maxlen=50)
        self.t_last = time.monotonic()
        self.n_last = 0
        self.examples = 0
        self.batches = 0

    def update(self, epoch: int, labels, probs, loss: float) -> None:
        self.labels.append(np.asarray(labels).ravel())
        self.probs.append(np.asarray(probs).ravel())
        self.losses.append(float(loss))
        self.examples += len(labels)
        self.batches += 1
        now = time.monotonic()
        if now - self.t_last >= self.every_s:
            self.emit(epoch, now)

    def emit(self, epoch: int, now: float | None = None) -> None:
        now = now or time.monotonic()
        rate = (self.examples - self.n_last) / max(1e-9, now - self.t_last)
        a = auc(np.concatenate(self.labels), np.concatenate(self.probs)) if self.labels else float("nan")
        log.info("%s pass %d/%d batch %d examples %d | %.0f ex/s | loss %.4f | running auc %.4f",
                 self.who, epoch + 1, self.epochs, self.batches, self.examples, rate,
                 float(np.mean(self.losses)) if self.losses else float("nan"), a)
        self.t_last, self.n_last = now, self.examples


def _predict(exe, program, prob, batch: readers.Batch, map_ids=None, bs: int = 4096) -> np.ndarray:
    out = []
    for s in range(0, len(batch), bs):
        b = readers.Batch(batch.labels[s:s + bs], batch.dense[s:s + bs], batch.feasigns[s:s + bs])
        if map_ids is not None:
            b = readers.Batch(b.labels, b.dense, map_ids(b.feasigns, grow=False))
        (p,) = exe.run(program, feed=_feed(b), fetch_list=[prob])
        out.append(np.asarray(p).ravel())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


class Vocab:
    """feasign (uint64) -> row of the single-process embedding table; row 0 = unseen."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.index: dict[int, int] = {}

    def __call__(self, fs: np.ndarray, grow: bool = True) -> np.ndarray:
        """Maps uint64[n,S] feasigns to uint64[n,S] rows (0 = unseen when not growing)."""
        u, inv = np.unique(fs, return_inverse=True)
        d = self.index
        rows = np.empty(len(u), dtype=np.uint64)
        for j, k in enumerate(u.tolist()):
            r = d.get(k)
            if r is None:
                if grow:
                    if len(d) + 1 >= self.capacity:
                        raise RuntimeError(f"single-process vocabulary full ({self.capacity} rows): "
                                           "raise --single-vocab-size")
                    r = d[k] = len(d) + 1
                else:
                    r = 0
            rows[j] = r
        return rows[inv.reshape(fs.shape)]

    def keys_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys uint64[m], rows int64[m]) of every feasign seen."""
        keys = np.fromiter(self.index.keys(), dtype=np.uint64, count=len(self.index))
        rows = np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index))
        return keys, rows


def _load_test(cfg: TrainConfig, test_files: list[str], slots) -> readers.Batch | None:
    if not test_files:
        return None
    budget = readers.BadLineBudget(cfg.max_bad_lines, cfg.max_bad_fraction)
    return readers.read_all(test_files, cfg.format, slots, budget=budget, limit=cfg.test_limit)


def _result_line(record: dict) -> None:
    """Prints the machine-readable result line (parsed by the local-cluster launcher)."""
    print("ELASTIC_CTR_RESULT " + json.dumps(record), flush=True)


def run_single(cfg: TrainConfig) -> dict:
    """Trains in this process without parameter servers, evaluates, exports if ``output``.
    Returns the result record (``test_auc`` per pass, ``examples_per_s``, ``version``...)."""
    train_files, test_files = check_inputs(cfg)
    import paddle

    from runtime.trainer import model

    paddle.enable_static()
    paddle.seed(cfg.seed)
    slots = cfg.slots()
    net = model.build_train(len(slots), cfg.embedding_dim, tuple(cfg.layers), ps=False,
                        vocab_size=cfg.single_vocab_size)
    test_prog = net.main.clone(for_test=True)
    with paddle.static.program_guard(net.main, net.startup):
        paddle.optimizer.Adam(cfg.lr, lazy_mode=True).minimize(net.loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(net.startup)
    vocab = Vocab(cfg.single_vocab_size)
    test = _load_test(cfg, test_files, slots)
    prog = Progress("single", cfg.epochs, cfg.log_every_s)
    budget = readers.BadLineBudget(cfg.max_bad_lines, cfg.max_bad_fraction)
    aucs, t_train = [], 0.0
    for epoch in range(cfg.epochs):
        t0 = time.monotonic()
        for b in readers.iter_batches(train_files, cfg.format, cfg.batch_size, slots, budget=budget):
            mb = readers.Batch(b.labels, b.dense, vocab(b.feasigns))
            loss, p = exe.run(net.main, feed=_feed(mb), fetch_list=[net.loss, net.prob])
            prog.update(epoch, b.labels, p, float(np.asarray(loss)))
        t_train += time.monotonic() - t0
        prog.emit(epoch)
        if test is not None:
            p = _predict(exe, test_prog, net.prob, test, map_ids=vocab)
            aucs.append(auc(test.labels, p))
            log.info("single pass %d/%d: test auc %.5f (%d rows)", epoch + 1, cfg.epochs, aucs[-1], len(test))
    rec = {"mode": "single", "trainers": 1, "pservers": 0, "epochs": cfg.epochs, "test_auc": aucs,
           "examples": prog.examples, "train_seconds": round(t_train, 3),
           "examples_per_s": round(prog.examples / max(t_train, 1e-9), 1)}
    if cfg.dump_predictions and test is not None:
        np.save(cfg.dump_predictions, _predict(exe, test_prog, net.prob, test, map_ids=vocab))
    if cfg.output:
        keys, rows = vocab.keys_rows()
        table = np.array(paddle.static.global_scope().find_var(model.TABLE_NAME).get_tensor())
        t0 = time.monotonic()
        ver = _export(cfg, slots, keys, table[rows].astype(np.float32), rec)
        rec.update(version=ver.id, export_seconds=round(time.monotonic() - t0, 3))
    _result_line(rec)
    return rec


def _export(cfg: TrainConfig, slots, keys: np.ndarray, values: np.ndarray, rec: dict):
    """Exports the trained model (head from the global scope) as a new version of
    ``cfg.output``; returns its donefile record."""
    import paddle

    from runtime import storage
    from runtime.trainer import export

    metrics = {"test_auc": rec["test_auc"][-1] if rec.get("test_auc") else None,
               "test_auc_per_pass": rec.get("test_auc", []), "mode": rec.get("mode"),
               "trainers": rec.get("trainers"), "pservers": rec.get("pservers"),
               "epochs": rec.get("epochs"), "examples_per_s": rec.get("examples_per_s")}
    training = {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                "sparse_shards": cfg.sparse_shards, "data_train": list(cfg.data_train)}
    return export.export_version(
        cfg.output, slots=slots, fmt=cfg.format, dim=int(cfg.embedding_dim), layers=cfg.layers,
        keys=keys, values=values, metrics=metrics, training=training,
        source_scope=paddle.static.global_scope(), token=storage.read_token(cfg.upload_token_file))


def _strategy(cfg: TrainConfig):
    from paddle.distributed import fleet

    from runtime.trainer import model

    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    # Keys are full proto paths (DistributedStrategy.sparse_table_configs setter, Paddle 3.0.0).
    strategy.sparse_table_configs = {
        model.TABLE_NAME: {f"table_parameters.{model.TABLE_NAME}.shard_num": int(cfg.sparse_shards)}}
    return strategy


def _dense_puller(fleet):
    """A function that pulls the dense parameters from the pservers into this trainer's
    scope.

    In Paddle 3.0.0 async mode the trainer program only pushes gradients; the pull of the
    updated dense parameters is done by the device worker of ``train_from_dataset``, not by
    ``exe.run``. Measured here: without this pull the trainer's dense parameters never
    change. Uses the runtime's (private) ``_pull_all_dense``, as ``init_worker`` does.
    """
    from paddle.distributed.ps.utils.public import get_the_one_recv_context

    rt = fleet.fleet._runtime_handle
    recv = get_the_one_recv_context(rt.context, split_dense_table=rt.is_heter_ps_mode)

    def pull() -> None:
        # Flush the queued pushes first: otherwise the client merges (sums) many batches'
        # gradients into one push and the Adam rules take one step for all of them.
        rt._worker.client_flush()
        rt._pull_all_dense(rt.scopes, rt._send_ctx, recv)

    return pull


def run_role(cfg: TrainConfig) -> dict | None:
    """Runs this process's parameter-server role (from the environment)."""
    role = roles.from_env()
    roles.apply(role)
    train_files, test_files = check_inputs(cfg)
    import paddle
    from paddle.distributed import fleet

    from runtime import proc
    from runtime.trainer import model

    paddle.enable_static()
    paddle.seed(cfg.seed)
    slots = cfg.slots()
    fleet.init(is_collective=False)
    net = model.build_train(len(slots), cfg.embedding_dim, tuple(cfg.layers), ps=True)
    test_origin = net.main.clone(for_test=True)
    with paddle.static.program_guard(net.main, net.startup):
        opt = fleet.distributed_optimizer(paddle.optimizer.Adam(cfg.lr), _strategy(cfg))
        opt.minimize(net.loss)
        # The PS program builder replaces the programs: the trainer (or server) program is
        # now loss.block.program and the startup program the (switched) default one.
        net.main = net.loss.block.program
        net.startup = paddle.static.default_startup_program()
    if fleet.is_server():
        log.info("pserver %s: serving (trainers %d)", role.endpoint, role.trainers)
        fleet.init_server()
        fleet.run_server()  # blocks until the process is stopped
        return None
    who = f"trainer {role.trainer_id}/{role.trainers}"
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(net.startup)
    for ep in role.pservers:
        host, _, port = ep.rpartition(":")
        log.info("%s: waiting for pserver %s", who, ep)
        proc.wait_for_port(host, int(port), timeout_s=cfg.wait_pserver_s, name=f"pserver {ep}")
    fleet.init_worker()
    pull_dense = _dense_puller(fleet)
    from paddle.distributed.fleet.utils.ps_util import DistributedInfer

    with paddle.static.program_guard(test_origin, net.startup):
        test_prog = DistributedInfer(main_program=test_origin, startup_program=net.startup).get_dist_infer_program()
    first = role.trainer_id == 0
    test = _load_test(cfg, test_files, slots) if first else None
    prog = Progress(who, cfg.epochs, cfg.log_every_s)
    budget = readers.BadLineBudget(cfg.max_bad_lines, cfg.max_bad_fraction)
    aucs, t_train = [], 0.0
    for epoch in range(cfg.epochs):
        t0 = time.monotonic()
        for b in readers.iter_batches(train_files, cfg.format, cfg.batch_size, slots,
                                shard=(role.trainer_id, role.trainers), budget=budget):
            loss, p = exe.run(net.main, feed=_feed(b), fetch_list=[net.loss, net.prob])
            pull_dense()
            prog.update(epoch, b.labels, p, float(np.asarray(loss)))
        t_train += time.monotonic() - t0
        prog.emit(epoch)
        # The last pass is evaluated after the save (pulling an unseen id creates it).
        if first and test is not None and epoch < cfg.epochs - 1:
            aucs.append(auc(test.labels, _predict(exe, test_prog, net.prob, test)))
            log.info("%s pass %d/%d: test auc %.5f (%d rows)", who, epoch + 1, cfg.epochs, aucs[-1], len(test))
    rec = {"mode": "ps", "trainers": role.trainers, "pservers": len(role.pservers), "trainer_id": role.trainer_id,
           "epochs": cfg.epochs, "examples": prog.examples, "train_seconds": round(t_train, 3),
           "examples_per_s": round(prog.examples / max(t_train, 1e-9), 1)}
    # Every trainer takes part in the save (it holds a barrier); only trainer 0's path is
    # used (Paddle 3.0.0 the_one_ps._save_one_table): the pservers write there, on their
    # own file system, so in Kubernetes cfg.table_dir is a shared (ReadWriteMany) volume.
    with table_save_dir(cfg.table_dir) as table_dir:
        t_save = time.monotonic()
        fleet.save_one_table(0, table_dir, 0)
        if first:
            log.info("%s: sparse table saved under %s in %.1f s", who, table_dir, time.monotonic() - t_save)
            if test is not None:
                p = _predict(exe, test_prog, net.prob, test)
                aucs.append(auc(test.labels, p))
                log.info("%s pass %d/%d: test auc %.5f (%d rows)", who, cfg.epochs, cfg.epochs, aucs[-1], len(test))
                if cfg.dump_predictions:
                    np.save(cfg.dump_predictions, p)
            rec["test_auc"] = aucs
            if cfg.output:
                from runtime.trainer import export

                t0 = time.monotonic()
                keys, values = export.read_saved_table(table_dir, cfg.embedding_dim)
                ver = _export(cfg, slots, keys, values, rec)
                rec.update(version=ver.id, export_seconds=round(time.monotonic() - t0 + (t0 - t_save), 3))
    fleet.stop_worker()
    _result_line(rec)
    return rec
