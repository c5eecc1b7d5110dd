"""The parameter-server client's push flags, which Paddle 3.0.0 offers no public way to set.

Why: in async mode the brpc PS client (``BrpcPsClient``, PaddlePaddle
``paddle/fluid/distributed/ps/service/brpc_ps_client.cc``) queues each batch's gradient
push; a consumer thread wakes every ``pserver_async_push_{sparse,dense}_interval_ms``
(10 ms) and sends only once ``pserver_push_{sparse,dense}_merge_limit`` (12) batches are
queued, summing them into ONE push. The pserver's Adam rules then take one step for a
dozen batches, and the test AUC drops (docs/training.md, ``--ps-mode async-merged``). With
merge limits 0 and a 1 ms interval every batch is its own push, as in synchronous
training.

How: these are ``PD_DEFINE`` flags of ``paddle::distributed::paddle_flags`` in
``libpaddle.so``. ``paddle.set_flags`` refuses them ("cannot set its value through this
function"), the environment is not read for them, and ``core.init_gflags`` runs once, so
the only way is to write the exported variables with ``ctypes``. They are read when the
client's push threads start, so ``apply()`` must run before ``fleet.init_worker()``. It
checks every symbol and its default first and raises if a Paddle build differs, rather
than training silently with merged pushes.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

#: flag -> (Paddle 3.0.0 default, value we set)
CLIENT_PUSH_FLAGS: dict[str, tuple[int, int]] = {
    "pserver_push_sparse_merge_limit": (12, 0),
    "pserver_push_dense_merge_limit": (12, 0),
    "pserver_async_push_sparse_interval_ms": (10, 1),
    "pserver_async_push_dense_interval_ms": (10, 1),
}


def _symbol(flag: str) -> str:
    """The mangled name of ``paddle::distributed::paddle_flags::FLAGS_<flag>``."""
    full = f"FLAGS_{flag}"
    return f"_ZN6paddle11distributed12paddle_flags{len(full)}{full}E"


def _library() -> ctypes.CDLL:
    import paddle

    return ctypes.CDLL(os.path.join(os.path.dirname(paddle.base.__file__), "libpaddle.so"))


def read() -> dict[str, int]:
    """The current value of each flag of ``CLIENT_PUSH_FLAGS`` (int32) in this process.
    Raises ``RuntimeError`` when a flag is not exported by this Paddle build."""
    lib = _library()
    out = {}
    for flag in CLIENT_PUSH_FLAGS:
        try:
            out[flag] = ctypes.c_int32.in_dll(lib, _symbol(flag)).value
        except ValueError:
            raise RuntimeError(f"this Paddle build has no {flag} flag ({_symbol(flag)}); the parameter-server "
                               "push fix of runtime.trainer.psflags is written for paddlepaddle 3.0.0") from None
    return out


def apply() -> dict[str, tuple[int, int]]:
    """Sets every flag of ``CLIENT_PUSH_FLAGS`` (call before ``fleet.init_worker()``).

    Returns ``{flag: (old, new)}``. Raises ``RuntimeError`` (nothing written) when a flag is
    missing or holds neither its known default nor our value (another Paddle build)."""
    current = read()
    for flag, (default, value) in CLIENT_PUSH_FLAGS.items():
        if current[flag] not in (default, value):
            raise RuntimeError(f"{flag} is {current[flag]}, expected Paddle 3.0.0's default {default}: "
                               "refusing to change flags of an unknown Paddle build")
    lib = _library()
    changed = {}
    for flag, (_, value) in CLIENT_PUSH_FLAGS.items():
        var = ctypes.c_int32.in_dll(lib, _symbol(flag))
        changed[flag] = (var.value, value)
        var.value = value
    log.debug("parameter-server client push flags: %s", changed)
    return changed
