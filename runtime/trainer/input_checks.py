"""The checks a training process makes of its inputs before anything starts: the data, the roots, the work and table directories (``check_inputs``).

A bad flag value is ``runtime.trainer.config``'s to refuse; these checks look at what the
values name (files, URLs, buckets, directories), so a missing file or an unwritable root
fails at start with the flag's name rather than at the first export.
"""
from __future__ import annotations

import os
import tempfile

from runtime.formats import partitions
from runtime.trainer import readers
from runtime.trainer.config import TABLE_DIR_PREFIX, TrainConfig


def check_inputs(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """Resolves train and test locations of a (valid) ``cfg``; raises
    ``storage.LocationError`` naming a missing file, an unreachable URL or a root that
    cannot be used (``check_roots``), ``ValueError`` for
    no training data or a directory that cannot be used. Call before starting anything.

    Training data is ``--data-train`` (files, globs, URLs), or ``--data-root`` with
    ``--start-hour`` [``--end-hour``]: in batch mode every partition of the range, each of
    which must be complete; in continuous mode the partitions are found as they land
    (``runtime.trainer.online``), so the train list returned is empty."""
    if not cfg.data_train and not cfg.data_root:
        raise ValueError("--data-train: no training data given (or --data-root with --start-hour/--end-hour)")
    if cfg.mode == "continuous":
        train = []
    elif cfg.data_root:
        start, end = cfg.hours()
        train = [f for h in partitions.hours(start, end) for f in partitions.files(cfg.data_root, h)]
    else:
        train = readers.resolve(cfg.data_train)
    test = readers.resolve(cfg.data_test) if cfg.data_test else []
    if cfg.slot_file:
        from runtime import storage

        storage.check_readable(cfg.slot_file)
    if cfg.table_dir:
        check_table_dir(cfg.table_dir)
    check_roots(cfg)
    if cfg.work_dir:
        try:
            os.makedirs(cfg.work_dir, exist_ok=True)
            os.rmdir(tempfile.mkdtemp(prefix="elastic-ctr-check-", dir=cfg.work_dir))
        except OSError as exc:
            raise ValueError(f"--work-dir {cfg.work_dir}: cannot create a directory in it ({exc})") from None
    return train, test


def check_roots(cfg: TrainConfig) -> None:
    """The data root (``--data-root``: reachable) and the version root (``--output``:
    writable with the upload token where this process exports, reachable elsewhere) checked before training, so a missing bucket or an
    unwritable root fails now with a clear error rather than at the first export
    (``runtime.roots.check_root``). Raises ``storage.LocationError`` naming the flag."""
    from runtime import roots, storage

    if cfg.data_root:
        roots.check_root(cfg.data_root, "--data-root")
    if cfg.output:
        if _exports(os.environ):
            roots.check_root(cfg.output, "--output", write=True, token=storage.read_token(cfg.upload_token_file))
        else:  # a pserver or a trainer other than 0: reads the root, never writes it (nor holds its credential)
            roots.check_root(cfg.output, "--output")


def _exports(env) -> bool:
    """Whether the process ``env`` describes writes the version root: trainer 0 of a
    parameter-server job, or a process outside one (a single trainer, a local launcher);
    never a pserver (``TRAINING_ROLE``, ``PADDLE_TRAINER_ID`` / ``VC_TASK_INDEX``:
    ``runtime.trainer.roles``)."""
    role = env.get("TRAINING_ROLE", "").strip().upper()
    if role == "PSERVER":
        return False
    if role == "TRAINER":
        return (env.get("PADDLE_TRAINER_ID") or env.get("VC_TASK_INDEX") or "0").strip() == "0"
    return True


def check_table_dir(base: str) -> None:
    """Creates ``base`` (the ``--table-dir``) if missing and checks that a subdirectory can
    be made in it, so a bad value fails before training rather than at the export.

    Raises ``ValueError`` naming the flag for a URL or a directory that cannot be created
    or written."""
    if "://" in str(base):
        raise ValueError(f"--table-dir {base}: expected a local directory (in Kubernetes a volume "
                         "shared by the pserver and trainer pods), not a URL")
    try:
        os.makedirs(base, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=TABLE_DIR_PREFIX + "check-", dir=base))
    except OSError as exc:
        raise ValueError(f"--table-dir {base}: cannot create a directory in it ({exc})") from None
