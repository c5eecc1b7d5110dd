"""The trainer role: data readers and generator, the CTR model, parameter-server and
single-process training, export. Entry points call ``set_paddle_flags()`` before Paddle is
imported."""
from __future__ import annotations

import os
import sys

#: Paddle flags of every process that builds training or export programs. The legacy
#: static graph: under the new IR (Paddle 3's default) ``sparse_embedding`` fails with
#: ``bool(Tensor) is not supported in static graph mode`` and programs save as PIR JSON.
PADDLE_FLAGS = {"FLAGS_enable_pir_api": "0"}


def set_paddle_flags(env: dict | None = None) -> None:
    """Puts ``PADDLE_FLAGS`` into ``env`` (default ``os.environ``). Call at an entry point,
    before Paddle is imported. Raises ``RuntimeError`` when this process already imported
    Paddle with other values (they are read once, at import)."""
    target = os.environ if env is None else env
    if env is None and "paddle" in sys.modules:
        wrong = {k: os.environ.get(k) for k, v in PADDLE_FLAGS.items() if os.environ.get(k) != v}
        if wrong:
            raise RuntimeError(f"paddle was imported before the trainer's flags were set: {wrong}, "
                               f"expected {PADDLE_FLAGS}")
    target.update(PADDLE_FLAGS)


def check_paddle_flags() -> None:
    """Raises ``RuntimeError`` unless ``PADDLE_FLAGS`` are set in this process (programs
    built without them fail or save in the wrong format)."""
    wrong = {k: os.environ.get(k) for k, v in PADDLE_FLAGS.items() if os.environ.get(k) != v}
    if wrong:
        raise RuntimeError(f"Paddle flags {wrong} are not {PADDLE_FLAGS}: call "
                           "runtime.trainer.set_paddle_flags() at the entry point, before importing paddle")
