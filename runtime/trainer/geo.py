"""GEO mode's table at an export point (``--ps-mode geo``): each trainer trains a local
hashed table (``runtime.trainer.idmap.geo_rows``) merged with the others' every
``--geo-k-steps`` batches, so no pserver holds the table by feasign. The trainers exchange
the feasigns they trained through a directory under ``--table-dir`` (``keys-<trainer>.npy``,
uint64[m] each) and the chief looks their rows up in its local table."""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from runtime.trainer.idmap import geo_rows


def gather_table(worker) -> tuple[np.ndarray, np.ndarray] | None:
    """The GEO job's table: every trainer writes its distinct feasigns (``worker.keys_seen``,
    uint64[m]) to ``<--table-dir>/elastic-ctr-keys-<n>/`` (``n``: a number the chief draws,
    summed over the trainers with gloo so all agree); the chief reads them all and looks
    their rows up in its local table. Every trainer calls it (barriers).

    Args:
        worker: a ``runtime.trainer.worker.PsWorker`` in GEO mode (``cfg``, ``role``,
            ``chief``, ``barrier()``).

    Returns ``(keys uint64[n], values float32[n, dim])`` on the chief, ``None`` elsewhere.
    Raises ``RuntimeError`` when a trainer's file is missing (``--table-dir`` not shared).
    """
    import paddle
    from paddle.distributed import fleet

    from runtime.trainer import model
    from runtime.trainer.config import TABLE_DIR_PREFIX

    draw = float(np.random.default_rng().integers(1, 1 << 30)) if worker.chief else 0.0
    nonce = int(np.asarray(fleet.util.all_reduce(np.array([draw]), "sum")).ravel()[0])
    base = worker.cfg.table_dir or os.path.dirname(tempfile.mkdtemp(prefix=TABLE_DIR_PREFIX))
    shared = os.path.join(base, f"elastic-ctr-keys-{nonce}")
    os.makedirs(shared, exist_ok=True)
    seen = getattr(worker, "keys_seen", np.zeros(0, np.uint64))
    np.save(os.path.join(shared, f"keys-{worker.role.trainer_id}.npy"), seen)
    worker.barrier()
    if not worker.chief:
        worker.barrier()
        return None
    try:
        parts = [np.load(os.path.join(shared, f"keys-{i}.npy")) for i in range(worker.role.trainers)]
    except OSError as exc:
        raise RuntimeError(f"--ps-mode geo: the trainers' feasigns are not all in {shared} ({exc}): "
                           "--table-dir must be a directory shared by every trainer") from None
    finally:
        worker.barrier()
        shutil.rmtree(shared, ignore_errors=True)
    keys = np.unique(np.concatenate(parts))
    table = np.array(paddle.static.global_scope().find_var(model.TABLE_NAME).get_tensor())
    rows = geo_rows(worker.cfg.geo_table_rows)(keys).astype(np.int64)
    return keys, table[rows].astype(np.float32)
