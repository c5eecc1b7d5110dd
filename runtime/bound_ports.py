"""The ports a role bound, told to whoever started it: the port-file contract.

Every long-running role (``fileserver``, ``cube server``, ``cube agent``, ``cube transfer``,
``serve``) takes port 0 for any of its ports (the kernel picks a free one when the role binds
it, so nothing is reserved and released beforehand) and ``--port-file PATH``: once every port
is bound and accepting, the role writes ``PATH`` as one JSON object, port name -> number, the
names of ``runtime.role_specs.PORTS`` (e.g. ``{"data": 40123, "http": 40124}`` for a cube
server). The file is written whole or not at all (a temporary file renamed over it), so a
reader never sees part of it. The local harnesses and the tests start roles on port 0 and
read their ports here (``runtime.proc.ProcessGroup.bound_ports``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

#: the flag every role takes
FLAG = "--port-file"


def add_flag(parser) -> None:
    """Adds ``--port-file PATH`` (default: none written) to a role's ``argparse`` parser."""
    parser.add_argument(FLAG, dest="port_file", default=None, metavar="PATH",
                        help="once every port is bound, write their numbers here as JSON {name: port} "
                             "(a port given as 0 is the one the kernel picked)")


def write(path: Optional[str | os.PathLike], ports: Mapping[str, int]) -> None:
    """Writes ``ports`` (name -> number) to ``path`` atomically; nothing when ``path`` is
    None. Raises ``ValueError`` for a port outside 1..65535 (an unbound one), ``OSError``
    when the file cannot be written."""
    if path is None:
        return
    bad = {k: v for k, v in ports.items() if not isinstance(v, int) or not 0 < v < 65536}
    if bad:
        raise ValueError(f"{FLAG}: ports {bad} are not bound ports (1..65535)")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(ports), sort_keys=True) + "\n")
    os.replace(tmp, path)


def read(path: str | os.PathLike) -> Optional[dict[str, int]]:
    """The ports written at ``path`` (name -> number), or None while it does not exist.
    Raises ``ValueError`` naming the file when it holds anything but that."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        ports = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a port file ({exc})") from None
    if not isinstance(ports, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in ports.items()):
        raise ValueError(f"{path}: not a port file (expected {{name: port}}, got {text[:200]!r})")
    return ports
