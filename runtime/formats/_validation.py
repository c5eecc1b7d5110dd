"""Turns pydantic validation errors into one message that names the input and the field."""
from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, ValidationError

_M = TypeVar("_M", bound=BaseModel)


def _no_bool(value: Any) -> Any:
    """JSON ``true``/``false`` are not numbers here (pydantic's lax mode would read 1/0)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    return value


#: a non-negative integer; numeric strings are accepted (``"17"``), booleans are not
NonNegInt = Annotated[int, BeforeValidator(_no_bool), Field(ge=0)]
#: a positive integer, as above
PosInt = Annotated[int, BeforeValidator(_no_bool), Field(ge=1)]


def describe(exc: ValidationError) -> str:
    """``field.path: what was wrong (got <value>)``, one clause per error, ``; ``-joined."""
    parts = []
    for err in exc.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
        msg = err["msg"]
        if err["type"] not in ("missing", "extra_forbidden") and "input" in err:
            msg += f" (got {err['input']!r:.80})"
        parts.append(f"{loc or 'document'}: {msg}")
    return "; ".join(parts)


def validated(cls: type[_M], obj: Any, error: type[Exception], source: str) -> _M:
    """``cls.model_validate(obj)``. Raises ``error`` with the message ``"<source>: <field>:
    <what was wrong>"`` (``describe``) when ``obj`` is not a valid ``cls``."""
    try:
        return cls.model_validate(obj)
    except ValidationError as exc:
        raise error(f"{source}: {describe(exc)}") from None
