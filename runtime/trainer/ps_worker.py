"""The Fleet parameter-server trainer: ``PsWorker``, a ``Worker`` whose sparse table lives on the pservers.

Paddle APIs used outside the public ones, and why (besides the scratch working directory of
a pass, ``runtime.trainer.worker``):

* ``psflags.apply()`` (ctypes): the client's push merging, see ``runtime.trainer.psflags``.
* ``_runtime_handle._worker.client_flush()`` and ``_pull_all_dense`` at a sync point (after
  the passes, before a save or an export, never per batch): Paddle 3.0.0 has no public call
  that sends the client's queued pushes or refreshes a trainer's copy of the dense
  parameters; ``train_from_dataset``'s own dense puller stops with the pass, so without
  the pull trainer 0 would export (and evaluate) a head a few batches old.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from runtime.trainer.config import TrainConfig
from runtime.trainer.idmap import geo_rows
from runtime.trainer.worker import Worker

# the worker's lines, under one logger name whichever module of it logs (runtime.trainer.passes does the same)
log = logging.getLogger("runtime.trainer.worker")


class PsWorker(Worker):
    """A Fleet parameter-server trainer (``a_sync=True``, Adam on the pservers), its role
    from ``runtime.trainer.roles``. Construction builds the programs, waits for every
    pserver, applies ``psflags`` and runs ``fleet.init_worker()``."""

    def __init__(self, cfg: TrainConfig, role):
        super().__init__(cfg)
        import paddle
        from paddle.distributed import fleet

        from runtime import proc
        from runtime.trainer import program, psflags

        self.role = role
        self.who = f"trainer {role.trainer_id}/{role.trainers}"
        self.chief = role.trainer_id == 0
        self.shard = (role.trainer_id, role.trainers)
        self.geo = cfg.ps_mode == "geo"
        self.collect_keys = self.geo or cfg.mode == "continuous"  # continuous: patches (fedrows)
        self.net, self.main, startup, test_origin = program.build_ps_programs(
            cfg, self.slots, continuous=cfg.mode == "continuous")
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        self.exe.run(startup)
        for ep in role.pservers:
            host, _, port = ep.rpartition(":")
            log.info("%s: waiting for pserver %s", self.who, ep)
            proc.wait_for_port(host, int(port), timeout_s=cfg.wait_pserver_s, name=f"pserver {ep}")
        if cfg.ps_mode == "async":
            psflags.apply()
        fleet.init_worker()
        from paddle.distributed.fleet.utils.ps_util import DistributedInfer

        with paddle.static.program_guard(test_origin, startup):
            self.test_program = DistributedInfer(main_program=test_origin,
                                                 startup_program=startup).get_dist_infer_program()

    def _runtime(self):
        from paddle.distributed import fleet

        return fleet.fleet._runtime_handle

    def id_map(self):
        return geo_rows(self.cfg.geo_table_rows) if self.geo else None

    def eval_ids(self, feasigns: np.ndarray) -> np.ndarray:
        return geo_rows(self.cfg.geo_table_rows)(feasigns) if self.geo else feasigns

    def barrier(self) -> None:
        """Waits for every trainer (gloo)."""
        from paddle.distributed import fleet

        fleet.util.barrier()

    def sync(self) -> None:
        """Sends this worker's queued pushes, waits for every trainer, then pulls the dense
        parameters (private calls: module docstring). GEO: waits only (each trainer's
        parameters are its local copies, merged with the others' every k steps)."""
        from paddle.distributed.ps.utils.public import get_the_one_recv_context

        if self.geo:
            self.barrier()
            return
        rt = self._runtime()
        rt._worker.client_flush()
        self.barrier()
        rt._pull_all_dense(rt.scopes, rt._send_ctx,
                           get_the_one_recv_context(rt.context, split_dense_table=rt.is_heter_ps_mode))

    def fed_rows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Every trainer's fed feasigns gathered on the chief, their rows pulled from the
        pservers (``runtime.trainer.fedrows``). Call after ``sync``."""
        from runtime.trainer import fedrows

        keys = fedrows.gather_keys(self)
        if keys is None:
            return None
        return keys, fedrows.pull(self, keys) if len(keys) else np.zeros((0, self.cfg.embedding_dim), np.float32)

    def full_table(self, save_dir: str, exact: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """``fleet.save_one_table(0, save_dir, 0)`` (the pservers write it; every trainer
        calls it, it holds barriers), then the chief reads it back; ``exact``: the chief
        then pulls the saved keys' values (``runtime.trainer.fedrows.pull``). GEO: the trained
        feasigns of every trainer (exchanged through ``--table-dir``) with the chief's
        local table rows."""
        from paddle.distributed import fleet

        from runtime.trainer import export

        if self.geo:
            from runtime.trainer import geo

            return geo.gather_table(self)
        t0 = time.monotonic()
        fleet.save_one_table(0, save_dir, 0)
        if not self.chief:
            return None
        log.info("%s: sparse table saved under %s in %.1f s", self.who, save_dir, time.monotonic() - t0)
        from runtime.metrics.trainer import metrics

        rows: dict[int, int] = {}  # per pserver, counted while reading
        if not exact:
            table = export.read_saved_table(save_dir, self.cfg.embedding_dim, rows)
            metrics().table_saved(rows)
            return table
        from runtime.trainer import fedrows

        keys, t0 = export.read_saved_keys(save_dir, rows), time.monotonic()
        metrics().table_saved(rows)
        values = fedrows.pull(self, keys) if len(keys) else np.zeros((0, self.cfg.embedding_dim), np.float32)
        log.info("%s: %d rows pulled in %.1f s", self.who, len(keys), time.monotonic() - t0)
        return keys, values

    def shrink(self, directory: str, decay: float, unseen_limit: int | None) -> tuple[np.ndarray, dict] | None:
        """Every trainer: ``sync``, ``fleet.shrink()`` (the accessor decays the counts and
        drops the rows unfed for more than ``delete_after_unseen_days`` shrink points: the
        table's configuration, ``runtime.trainer.lifecycle``; ``decay`` and ``unseen_limit``
        are its values), then ``fleet.save_one_table(0, directory, 3)``, whose mode 3 ticks
        every row's ``unseen_days``; trainer 0 reads the saved keys back."""
        from paddle.distributed import fleet

        from runtime.trainer import export

        self.sync()
        fleet.shrink()
        fleet.save_one_table(0, directory, 3)
        if not self.chief:
            return None
        rows: dict[int, int] = {}
        return export.read_saved_keys(directory, rows), rows

    def checkpoint(self, directory: str) -> None:
        """``fleet.save_persistables(exe, directory, main, mode=0)``: every pserver saves
        all its tables (sparse rows with their optimizer state, dense parameters and
        moments) under ``directory``, on its own file system: in a cluster a volume
        shared by every pod (``--state-dir``). Every trainer calls it (barriers)."""
        from paddle.distributed import fleet

        if self.chief:
            os.makedirs(directory, exist_ok=True)
        self.barrier()
        fleet.save_persistables(self.exe, directory, self.main, mode=0)
        if self.chief:  # the job shape it was written with (a resize restores it into another)
            from runtime.trainer import checkpoint

            checkpoint.write_info(directory, checkpoint.CheckpointInfo(
                pservers=len(self.role.pservers), trainers=self.role.trainers,
                pserver_table_shards=self.cfg.pserver_table_shards, embedding_dim=self.cfg.embedding_dim))

    def restore(self, directory: str) -> str | None:
        """``fleet.load_model`` (the pservers load every table), then every trainer pulls
        the dense parameters (``sync``); into another pserver or shard count, re-seeded
        and verified row by row (``runtime.trainer.checkpoint.restore_ps``). Returns that
        layout change (e.g. ``"pservers 1 -> 2"``) or ``None``."""
        from runtime.trainer import checkpoint

        change = checkpoint.restore_ps(self, directory)
        self._eval_exe = None
        return change

    def close(self) -> None:
        from paddle.distributed import fleet

        fleet.stop_worker()
