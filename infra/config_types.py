"""Validators shared by the stack config models (``infra/config.py`` and the
``config_<area>.py`` modules beside it): one definition of a bounded check and of Pulumi's
config booleans."""
from __future__ import annotations

from typing import Any, Callable

from pydantic import AfterValidator


def check(ok: Callable[[Any], bool], allowed: str) -> AfterValidator:
    """An after-validator: passes a value for which ``ok(value)`` is true, else raises a
    ``ValueError`` whose message is ``allowed`` (what the key accepts, shown in the error
    that names the key)."""
    def run(v):
        if not ok(v):
            raise ValueError(allowed)
        return v
    return AfterValidator(run)


def pulumi_bool(v: Any) -> bool:
    """Pulumi's config booleans: ``true``/``false`` (strings as ``pulumi config set`` stores
    them, or booleans); pydantic alone would take yes/on/1 too. Raises ``ValueError``."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError("true or false")
