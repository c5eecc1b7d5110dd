"""GEO mode's table at an export point (``--ps-mode geo``): each trainer trains a local
hashed table (``runtime.trainer.idmap.geo_rows``) merged with the others' every
``--geo-k-steps`` batches, so no pserver holds the table by feasign. The trainers exchange
the feasigns they trained through a directory under ``--table-dir`` (``fedrows.gather_keys``)
and the chief looks their rows up in its local table."""
from __future__ import annotations

import numpy as np

from runtime.trainer.idmap import geo_rows


def gather_table(worker) -> tuple[np.ndarray, np.ndarray] | None:
    """The GEO job's table: the trainers' distinct feasigns (``worker.keys_seen``, uint64[m]
    each) gathered on the chief (``runtime.trainer.fedrows.gather_keys``, through
    ``--table-dir``), which looks their rows up in its local table. Every trainer calls it
    (barriers).

    Args:
        worker: a ``runtime.trainer.ps_worker.PsWorker`` in GEO mode (``cfg``, ``role``,
            ``chief``, ``barrier()``).

    Returns ``(keys uint64[n], values float32[n, dim])`` on the chief, ``None`` elsewhere.
    Raises ``RuntimeError`` when a trainer's file is missing (``--table-dir`` not shared).
    """
    import paddle

    from runtime.trainer import fedrows, model

    keys = fedrows.gather_keys(worker, "--ps-mode geo")
    if keys is None:
        return None
    table = np.array(paddle.static.global_scope().find_var(model.TABLE_NAME).get_tensor())
    rows = geo_rows(worker.cfg.geo_table_rows)(keys).astype(np.int64)
    return keys, table[rows].astype(np.float32)
