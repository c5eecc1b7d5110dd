"""The CTR DNN (static graph): training program and the dense inference program.

Training program inputs: ``dense_input`` float32[n,13] (normalized), ``C1``..``C<S>`` int64[n,1]
(feasign ids, the uint64 reinterpreted as int64), ``label`` int64[n,1]. Each slot's id is
looked up in ONE shared embedding table ``SparseFeatFactors`` of width ``dim``:
``paddle.static.nn.sparse_embedding`` (parameter server) or ``paddle.static.nn.embedding``
over a local vocabulary (single process). The head: concat(26 embeddings, dense) ->
fully connected ReLU layers ``layers`` -> 1 logit; ``prob = sigmoid(logit)``; loss = mean
binary cross-entropy.

The dense inference program takes the looked-up embeddings instead of ids (feeds
``dense_input`` float32[n,13] and ``emb_1``..``emb_<S>`` float32[n,dim], fetch ``prob``
float32[n,1]); its parameters have the same names as the training program's head
(``fc_<i>.w_0``, ``fc_<i>.b_0``), so they are copied by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import paddle

from runtime.formats import features
from runtime.trainer import check_paddle_flags

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


def build_train(num_slots: int, dim: int, layers: tuple[int, ...], ps: bool,
                vocab_size: int = 1 << 20) -> Net:
    """Builds the training program (module docstring) in fresh programs; ``ps`` picks the
    parameter-server sparse table or a local embedding of ``vocab_size`` rows (row 0 = the
    zero vector of unseen feasigns)."""
    check_paddle_flags()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        dense = paddle.static.data("dense_input", [-1, features.NUM_DENSE], "float32")
        ids = [paddle.static.data(f"C{i + 1}", [-1, 1], "int64") for i in range(num_slots)]
        label = paddle.static.data("label", [-1, 1], "int64")
        attr = paddle.ParamAttr(name=TABLE_NAME,
                                initializer=paddle.nn.initializer.Uniform(-INIT_RANGE, INIT_RANGE))
        embs = []
        for x in ids:
            if ps:
                e = paddle.static.nn.sparse_embedding(input=x, size=[1024, dim], param_attr=attr)
            else:
                e = paddle.static.nn.embedding(input=x, size=[vocab_size, dim], is_sparse=True,
                                               padding_idx=0, param_attr=attr)
            embs.append(paddle.reshape(e, [-1, dim]))
        logit = _head(embs, dense, layers)
        prob = paddle.nn.functional.sigmoid(logit)
        loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(
            logit, paddle.cast(label, "float32")))
    return Net(main, startup, ["dense_input"] + [f"C{i + 1}" for i in range(num_slots)] + ["label"],
               dense, ids, label, embs, prob, loss)


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
