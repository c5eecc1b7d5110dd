"""The parameter-server programs every role builds (pserver and trainer build the same
ones): the ``DistributedStrategy`` (async or GEO, the sparse table's ``shard_num``) and the
trainer/server program from ``fleet.distributed_optimizer(...).minimize``. Paddle 3.0.0,
legacy static graph (``runtime.trainer.PADDLE_FLAGS``)."""
from __future__ import annotations

from runtime.trainer.config import TrainConfig


def strategy(cfg: TrainConfig, continuous: bool = False):
    """The ``DistributedStrategy``: async, the sparse table's ``shard_num`` and its
    accessor's feature lifecycle (``runtime.trainer.lifecycle``: admission threshold,
    decay, eviction), as full proto paths (a short key is silently ignored). All table keys
    in ONE assignment: every assignment to ``sparse_table_configs`` adds a table.
    ``continuous`` changes nothing today (patches are the fed feasigns' rows, pulled:
    ``runtime.trainer.fedrows``). ``--ps-mode geo``: ``a_sync_configs = {"k_steps": ...}``
    (GEO-SGD) instead, with its local table (no lifecycle)."""
    from paddle.distributed import fleet

    from runtime.trainer import lifecycle, model

    s = fleet.DistributedStrategy()
    s.a_sync = True
    if cfg.ps_mode == "geo":
        s.a_sync_configs = {"k_steps": int(cfg.geo_k_steps)}
        return s
    prefix = f"table_parameters.{model.TABLE_NAME}"
    table = {f"{prefix}.shard_num": int(cfg.pserver_table_shards), **lifecycle.Lifecycle.of(cfg).accessor_configs(prefix)}
    s.sparse_table_configs = {model.TABLE_NAME: table}
    return s


def build_ps_programs(cfg: TrainConfig, slots, continuous: bool = False):
    """Builds the parameter-server programs (every role builds the same ones). Returns
    ``(net, main, startup, test_origin)``: the trainer program, its startup program and
    the test program as cloned before ``minimize``."""
    import paddle
    from paddle.distributed import fleet

    from runtime.trainer import model

    paddle.enable_static()
    paddle.seed(cfg.seed)
    geo = cfg.ps_mode == "geo"
    # GEO synchronizes a local table (its communicator cannot send a sparse_embedding's
    # rows in Paddle 3.0.0: "The Variable type must be DenseTensor ... SelectedRows")
    net = model.build_train(len(slots), cfg.embedding_dim, tuple(cfg.layers), ps=not geo,
                            vocab_size=cfg.geo_table_rows)
    test_origin = net.main.clone(for_test=True)
    model.add_auc(net)
    with paddle.static.program_guard(net.main, net.startup):
        opt = fleet.distributed_optimizer(paddle.optimizer.Adam(cfg.lr, lazy_mode=geo), strategy(cfg, continuous))
        opt.minimize(net.loss)
        # The PS program builder replaces the programs: the trainer (or server) program is
        # now loss.block.program and the startup program the (switched) default one.
        startup = paddle.static.default_startup_program()
    return net, net.loss.block.program, startup, test_origin
