"""The export step shared by the batch job (``runtime.trainer.train``) and the continuous
job (``runtime.trainer.online``): the directory one sparse-table save goes to, and the
publication of a trained model as a version of ``--output`` (``runtime.trainer.export``
writes the files and the donefile line).

Below both jobs: ``train`` imports ``online``, both import this module, it imports
neither.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np

from runtime.trainer.config import TABLE_DIR_PREFIX, TrainConfig
from runtime.trainer.input_checks import check_table_dir


@contextlib.contextmanager
def table_save_dir(base: str | None) -> Iterator[str]:
    """A fresh, empty directory for one table save (``<base>/elastic-ctr-table-XXXX``),
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


def export_metadata(cfg: TrainConfig, rec: dict) -> tuple[dict, dict]:
    """``(metrics, training)`` records of ``model_meta.json`` (``runtime.formats.model_meta``)
    for a result record ``rec`` (``test_auc`` per pass, ``mode``, ``trainers``,
    ``pservers``, ``epochs``, ``examples_per_s`` examples/s; missing keys give ``None``;
    ``evaluation``: the version's evaluation record, kept when set)."""
    metrics = {"test_auc": rec["test_auc"][-1] if rec.get("test_auc") else None,
               "test_auc_per_pass": rec.get("test_auc", []), "mode": rec.get("mode"),
               "trainers": rec.get("trainers"), "pservers": rec.get("pservers"),
               "epochs": rec.get("epochs"), "examples_per_s": rec.get("examples_per_s")}
    if rec.get("evaluation") is not None:  # runtime.formats.version_eval (continuous jobs)
        metrics["evaluation"] = rec["evaluation"]
    training = {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr, "threads": cfg.threads,
                "pserver_table_shards": cfg.pserver_table_shards, "data_train": list(cfg.data_train)}
    return metrics, training


def publish(cfg: TrainConfig, slots, keys: np.ndarray, values: np.ndarray, rec: dict, **kwargs):
    """Exports the trained model as a new version of ``cfg.output`` (trainer 0 only).

    Args:
        slots: the model's slot ids (``TrainConfig.slots()``), in input order.
        keys: uint64[n] feasigns of the sparse rows to publish (all of them for a base,
            the changed ones for a patch).
        values: float32[n, embedding_dim] their embeddings.
        rec: the job's result record (``export_metadata``).
        kwargs: go to ``runtime.trainer.export.export_version`` (``version_id``,
            ``base_id``...).

    The dense head is read from Paddle's global scope. Returns the version's donefile
    record (``runtime.formats.donefile.DonefileRecord``). Raises
    ``runtime.trainer.export.ExportError`` naming the failed step.
    """
    import paddle

    from runtime import storage
    from runtime.trainer import export as exp

    metrics, training = export_metadata(cfg, rec)
    return exp.export_version(
        cfg.output, slots=slots, fmt=cfg.format, dim=int(cfg.embedding_dim), layers=cfg.layers,
        keys=keys, values=values, metrics=metrics, training=training,
        source_scope=paddle.static.global_scope(), token=storage.read_token(cfg.upload_token_file), **kwargs)
