"""A role's persisted state as one typed JSON file: ``StateFile`` records (pydantic, unknown
fields refused) written through a fsynced temporary file renamed into place, so a crash
leaves the previous state or the new one, never half of one; read back by the same role
after a restart. The cube transfer (``runtime.cube.transfer.state``), the cube agent
(``runtime.cube.agent.state``) and the cube server (``runtime.cube.server.state``) keep
theirs this way.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.formats._validation import describe

_T = TypeVar("_T", bound="StateFile")
_B = TypeVar("_B", bound=BaseModel)


class StateError(RuntimeError):
    """A state file is unreadable; the message names the file and the field. The role
    decides whether to refuse to start (the transfer: it could repeat or skip rollouts) or
    to start empty (the agent, the cube server: the transfer brings them back)."""


def read_record(path: Union[str, os.PathLike], cls: type[_B], error: type[Exception], what: str) -> Optional[_B]:
    """The JSON record of type ``cls`` in the local file ``path``; None when the file does
    not exist. Raises ``error("<path>: not a valid <what> (...)")`` when it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        return cls.model_validate_json(raw)
    except ValueError as exc:
        raise error(f"{path}: not a valid {what} ({exc})") from None


def write_atomically(path: Union[str, os.PathLike], text: str) -> None:
    """Writes ``text`` to ``path`` (its directory created) through a fsynced temporary file
    renamed into place: a crash leaves the previous content or the new one, never half of
    it. Raises ``OSError``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class StateFile(BaseModel):
    """Base of a persisted state record (``extra="forbid"``: a reader accepts exactly what
    its writer writes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object written (aliases used)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def load(cls: type[_T], path: Union[str, os.PathLike]) -> Optional[_T]:
        """The record in ``path``; None when the file does not exist. Raises
        ``StateError`` naming the file (and the field) when it cannot be read."""
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"{path}: unreadable ({exc})") from None
        try:
            return cls.model_validate(json.loads(text))
        except ValueError as exc:
            why = describe(exc) if isinstance(exc, ValidationError) else f"not JSON ({exc})"
            raise StateError(f"{path}: {why}") from None

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the record to ``path`` (``write_atomically``). Raises ``OSError``."""
        write_atomically(path, json.dumps(self.to_json(), indent=1, sort_keys=True))
