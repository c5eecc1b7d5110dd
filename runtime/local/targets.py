"""Scrape targets of the local pipeline, as Prometheus file-based service discovery files
(``file_sd_configs``): ``<dir>/<job>--<name>.json`` holding ``[{"targets":
["host:port"], "labels": {...}}]``, one file per process, written atomically when the
process is started (a stopped process's target stays: Prometheus sees it down, as it would a lost pod). ``<job>`` is the
role spec's name (``cube-server``, ``serving``, ``trainer``...: the ``job`` label, as the
stack's ServiceMonitors and PodMonitors set it) and the address comes from the spec's
``metrics`` port (``runtime.role_specs``).

The directory is ``$ELASTIC_CTR_SCRAPE_DIR`` (``SCRAPE_DIR_ENV``): ``elastic-ctr local
--prometheus`` sets it before it starts any role, so every launcher (the local cube, the
local services, ``train --local-cluster``: its pservers and trainers) writes its
processes' files there; unset, nothing is written. ``runtime.local.prometheus_server``'s one
scrape job reads ``<dir>/*.json``; each target carries its ``job`` label (Prometheus keeps
a ``job`` that service discovery gives).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

from runtime.role_specs import LOOPBACK, RoleSpec

SCRAPE_DIR_ENV = "ELASTIC_CTR_SCRAPE_DIR"


def scrape_dir() -> Optional[Path]:
    """``$ELASTIC_CTR_SCRAPE_DIR`` as a path, or None when unset."""
    d = os.environ.get(SCRAPE_DIR_ENV, "").strip()
    return Path(d) if d else None


def target_file(directory: Path, job: str, name: str) -> Path:
    """``<directory>/<job>--<name>.json``. Raises ``ValueError`` for a name with ``/`` or ``--``."""
    for what, v in (("job", job), ("name", name)):
        if not v or "/" in v or "--" in v:
            raise ValueError(f"scrape target {what} {v!r}: a non-empty name without '/' or '--'")
    return directory / f"{job}--{name}.json"


def register(spec: RoleSpec, name: str, labels: Optional[Mapping[str, str]] = None, host: str = LOOPBACK,
             directory: Optional[Path] = None) -> Optional[Path]:
    """Writes the target of process ``name`` running ``spec`` (job ``spec.name``, address
    ``host:<spec's metrics port>``, extra ``labels``) into ``directory`` (default
    ``scrape_dir()``). Returns the file, or None when there is no directory or the spec
    has no metrics."""
    directory = directory or scrape_dir()
    if directory is None or spec.metrics is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = target_file(directory, spec.name, name)
    doc = [{"targets": [f"{host}:{spec.port(spec.metrics.port)}"], "labels": {"job": spec.name, **(labels or {})}}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # Prometheus never reads half a file
    return path


def unregister(path: Optional[Path]) -> None:
    """Removes a file ``register`` wrote (None or a missing file: nothing)."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
