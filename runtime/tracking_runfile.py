"""A run's id file (``RunIdFile``, ``<state_dir>/tracking/<name>.json``), by which a resumed job continues its MLflow run.

The tracker (``runtime.tracking_client``) writes it once its run exists; a restarted job
reads it at start, and a child run finds its job's run there (``runtime.tracking``).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

log = logging.getLogger("runtime.tracking_client")  # the tracker's warnings, under one name

RUN_DIR = "tracking"


class RunIdFile:
    """``<state_dir>/tracking/<name>.json``: ``{"run_id": str, "experiment_id": str,
    "uri": str}`` of a job's run, written atomically once the run exists, read at start so
    a resumed job continues its run. A file for another URI is ignored (a new run)."""

    def __init__(self, state_dir: str, name: str):
        # absolute now: the tracker's thread writes it while a training pass runs in a
        # scratch working directory (runtime.trainer.worker), which a relative path would follow
        self.path = os.path.abspath(os.path.join(state_dir, RUN_DIR, f"{name}.json"))

    def record(self) -> Optional[dict]:
        """The file's ``{"run_id", "experiment_id", "uri"}``, or None when there is none."""
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def read(self, uri: str) -> Optional[str]:
        """The stored run id for ``uri``, or None (no file, another URI, or unreadable: warned)."""
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("tracking: %s is not a run id file (%s); starting a new run", self.path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("uri") != uri or not isinstance(doc.get("run_id"), str):
            return None
        return doc["run_id"]

    def write(self, uri: str, run_id: str, experiment_id: str) -> None:
        """Writes the file atomically (temp file + rename)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"run_id": run_id, "experiment_id": experiment_id, "uri": uri}, f)
        os.replace(tmp, self.path)
