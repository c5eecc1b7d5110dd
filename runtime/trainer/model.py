"""The CTR DNN (static graph): training program and the dense inference program.

Training program inputs (named and ordered as ``runtime.trainer.datafeed.use_var_names``, the
order of the dataset's MultiSlot lines): ``dense_input`` float32[n,13] (normalized),
``C1``..``C<S>`` int64[n,1] (feasign ids, the uint64 reinterpreted as int64), ``label``
int64[n,1]. Each slot's id is
looked up in ONE shared embedding table ``SparseFeatFactors`` of width ``dim``:
``paddle.static.nn.sparse_embedding`` (parameter server) or ``paddle.static.nn.embedding``
over a local vocabulary (single process). The parameter servers' table is ``dim + 1`` wide
(``ps_table_width``) and the program uses its last ``dim`` columns: the accessor's
``embedx`` part, which a row gets only once admitted (``runtime.trainer.lifecycle``); the
first column, the accessor's ``embed_w`` that every row has, is dropped (its gradient is
zero and it stays at its zero initialisation), so a feasign not admitted reads as zeros. The head: concat(26 embeddings, dense) ->
fully connected ReLU layers ``layers`` -> 1 logit; ``prob = sigmoid(logit)``; loss = mean
binary cross-entropy. The training program also carries Paddle's ``auc`` op (4095
thresholds): its persistable bucket counts ``stat_pos``/``stat_neg`` give the running AUC
and the number of examples trained (the trainer resets them every pass).

The dense inference program takes the looked-up embeddings instead of ids (feeds
``dense_input`` float32[n,13] and ``emb_1``..``emb_<S>`` float32[n,dim], fetch ``prob``
float32[n,1]); its parameters have the same names as the training program's head
(``fc_<i>.w_0``, ``fc_<i>.b_0``), so they are copied by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import paddle

from runtime.formats import features
from runtime.trainer import check_paddle_flags, datafeed

TABLE_NAME = "SparseFeatFactors"
INIT_RANGE = 0.01  # uniform initializer range of the embedding table (single process)


@dataclass
class Net:
    """Handles to a built program's variables."""

    main: "paddle.static.Program"
    startup: "paddle.static.Program"
    feeds: list  # feed variable names, in order
    dense: object
    ids: list
    label: object | None
    embs: list
    prob: object
    loss: object | None
    stat_pos: object | None = None  # auc op buckets, int64[1, 4096]: positives per threshold
    stat_neg: object | None = None  # negatives per threshold
    last_loss: object | None = None  # float32[1], persistable copy of the last batch's loss

    @property
    def use_vars(self) -> list:
        """The data variables in MultiSlot line order (dense, ids..., label)."""
        return [self.dense, *self.ids, self.label]


def _head(embs: list, dense, layers: tuple[int, ...]):
    x = paddle.concat(embs + [dense], axis=1)
    for i, width in enumerate(layers):
        x = paddle.static.nn.fc(
            x, width, activation="relu",
            weight_attr=paddle.ParamAttr(name=f"fc_{i}.w_0",
                                         initializer=paddle.nn.initializer.Normal(std=1.0 / (x.shape[1] ** 0.5))),
            bias_attr=paddle.ParamAttr(name=f"fc_{i}.b_0"))
    n = len(layers)
    logit = paddle.static.nn.fc(
        x, 1,
        weight_attr=paddle.ParamAttr(name=f"fc_{n}.w_0",
                                     initializer=paddle.nn.initializer.Normal(std=1.0 / (x.shape[1] ** 0.5))),
        bias_attr=paddle.ParamAttr(name=f"fc_{n}.b_0"))
    return logit


def ps_table_width(dim: int) -> int:
    """Width of the parameter servers' sparse table for embeddings of ``dim``: ``dim + 1``
    (the accessor's ``embed_w`` column, which every row has, then ``dim`` of ``embedx``,
    which only admitted rows have; ``runtime.trainer.lifecycle``)."""
    return int(dim) + 1


def build_train(num_slots: int, dim: int, layers: tuple[int, ...], ps: bool,
                vocab_size: int = 1 << 20) -> Net:
    """Builds the training program (module docstring) in fresh programs. ``ps=True``: the
    parameter server's sparse table (``sparse_embedding``, ids = feasigns); ``ps=False``: a
    local embedding of ``vocab_size`` rows (ids = rows; row 0 = the zero vector of unseen
    feasigns), which is also the table GEO mode synchronizes."""
    check_paddle_flags()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        dense = paddle.static.data(datafeed.DENSE_VAR, [-1, features.NUM_DENSE], "float32")
        ids = [paddle.static.data(datafeed.slot_var(i), [-1, 1], "int64") for i in range(num_slots)]
        label = paddle.static.data(datafeed.LABEL_VAR, [-1, 1], "int64")
        attr = paddle.ParamAttr(name=TABLE_NAME,
                                initializer=paddle.nn.initializer.Uniform(-INIT_RANGE, INIT_RANGE))
        embs = []
        for x in ids:
            if ps:  # width dim + 1: the accessor's embed_w column first, unused (module docstring)
                e = paddle.static.nn.sparse_embedding(input=x, size=[1024, ps_table_width(dim)], param_attr=attr)
                e = paddle.reshape(e, [-1, ps_table_width(dim)])[:, 1:]
            else:
                e = paddle.static.nn.embedding(input=x, size=[vocab_size, dim], is_sparse=True,
                                               padding_idx=0, param_attr=attr)
            embs.append(paddle.reshape(e, [-1, dim]))
        logit = _head(embs, dense, layers)
        prob = paddle.nn.functional.sigmoid(logit)
        loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(
            logit, paddle.cast(label, "float32")))
    return Net(main, startup, datafeed.use_var_names(num_slots), dense, ids, label, embs, prob, loss)


def add_auc(net: Net) -> Net:
    """Adds Paddle's ``auc`` op on ``prob`` to ``net.main`` (call after cloning the test
    program, before ``minimize``); sets ``net.stat_pos`` / ``net.stat_neg`` and makes the
    loss persistable (readable by the progress thread while a pass runs)."""
    with paddle.static.program_guard(net.main, net.startup):
        two = paddle.concat([1 - net.prob, net.prob], axis=1)
        _, _, stats = paddle.static.auc(input=two, label=net.label, num_thresholds=4095, slide_steps=20)
        # a persistable copy of the loss: the loss itself is freed after use, so a
        # progress thread (which reads the scope while a pass runs) would find nothing
        net.last_loss = paddle.static.create_global_var([1], 0.0, "float32", persistable=True,
                                                        name="last_loss")
        paddle.assign(net.loss, output=net.last_loss)
    net.stat_pos, net.stat_neg = stats[2], stats[3]
    return net


def build_infer(num_slots: int, dim: int, layers: tuple[int, ...]) -> Net:
    """Builds the dense inference program: feeds ``dense_input``, ``emb_1``..``emb_<S>``,
    fetch ``prob`` (a variable named exactly so)."""
    check_paddle_flags()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        dense = paddle.static.data("dense_input", [-1, features.NUM_DENSE], "float32")
        embs = [paddle.static.data(f"emb_{i + 1}", [-1, dim], "float32") for i in range(num_slots)]
        logit = _head(embs, dense, layers)
        p = paddle.nn.functional.sigmoid(logit)
        prob = main.global_block().create_var(name="prob", shape=p.shape, dtype="float32")
        paddle.assign(p, output=prob)
    return Net(main, startup, ["dense_input"] + [f"emb_{i + 1}" for i in range(num_slots)],
               dense, [], None, embs, prob, None)


def dense_param_names(layers: tuple[int, ...]) -> list[str]:
    """Names of the head's parameters (shared by training and inference programs)."""
    out = []
    for i in range(len(layers) + 1):
        out += [f"fc_{i}.w_0", f"fc_{i}.b_0"]
    return out
