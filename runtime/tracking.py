"""MLflow tracking of the pipeline's jobs: the one owner of what goes to a tracking server,
its runs, names and steps (docs/tracking.md lists them). The transport, a non-blocking
client that never stops training, is ``runtime.tracking_client`` (``Tracker``).

Runs (tags ``elastic_ctr.role`` and ``elastic_ctr.job`` on each):

* **the job's run** (role ``job``, name = the job's name, ``job_name``): made by trainer 0;
  params = the training settings (``TrainConfig``) and the job's scale (``trainers``,
  ``pservers``, ``job_mode``); tag ``mlflow.source.git.commit`` (``code_version``); each
  partition trained as an ``mlflow.data`` dataset input (context ``training``); the job's
  figures (``JOB_METRICS``, ``EXPORT_METRICS``) and, per version, tags
  ``version.<id>.kind|base|hour``, per partition the data gate quarantined the tag
  ``partition.<YYYYMMDD-HH>.quarantined`` (its anomalies), and the artifact ``versions/<id>.json`` (``{"id", "kind",
  "base", "hour", "rows", "seconds", "model_meta": <model_meta.json>}``; never the model);
* **a child run per trainer** (role ``trainer``, ``elastic_ctr.trainer_id``, name
  ``<job>-trainer<i>``, tagged ``mlflow.parentRunId`` = the job's run): that trainer's own
  figures (``TRAINER_METRICS``);
* **the cube transfer's run** (role ``transfer``, name ``transfer-<dict>``), a child of the
  job's run when the transfer is told the job (``$ELASTIC_CTR_JOB``): per version rolled
  out, ``TRANSFER_METRICS`` and the tag ``version.<id>.kind`` (base | patch, the
  donefile's words; a patch is never ``delta`` here).

Steps: in the job's and the trainers' runs, a continuous job's step is the partition's
index from ``--start-hour`` (``partition_step``), a batch job's the pass (0-based; its
totals without a step); in the transfer's run the step is the version id. Each name has
one meaning: ``partition_rows`` is the whole partition (every trainer's share summed),
``trainer_rows`` one trainer's share. Run ids are kept in ``--state-dir/tracking/``
(``job.json``, ``trainer-<i>.json``) and the transfer's work dir, so a resumed job and a
restarted transfer continue their runs.

Environment: ``MLFLOW_TRACKING_URI`` (none: nothing is logged, nothing imported),
``MLFLOW_EXPERIMENT_NAME``, ``ELASTIC_CTR_JOB`` (the job's name, given to every process of
a job and to the transfer: the local launchers and the stack set it),
``ELASTIC_CTR_GIT_COMMIT`` (the code's version; the images are built with it; else ``git``
is asked in a checkout).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from runtime.tracking_client import (CLOSE_TIMEOUT_S, COMMIT_TAG, DEFAULT_EXPERIMENT, EXPERIMENT_ENV, JOB_TAG,
                                     ROLE_TAG, URI_ENV, NullTracker, Tracker, experiment_name, start,
                                     trackers, tracking_uri)
from runtime.tracking_runfile import RunIdFile

#: the client's names are used through this module (the pipeline's one tracking module)
__all__ = ["CLOSE_TIMEOUT_S", "COMMIT_TAG", "DEFAULT_EXPERIMENT", "EXPERIMENT_ENV", "JOB_TAG", "ROLE_TAG", "URI_ENV",
           "NullTracker", "RunIdFile", "Tracker", "experiment_name", "start", "trackers", "tracking_uri",
           "JOB_ENV", "COMMIT_ENV", "JOB_METRICS", "TRAINER_METRICS", "EXPORT_METRICS", "TRANSFER_METRICS",
           "job_name", "code_version", "JobTracking", "start_training", "partition_step", "finite",
           "published_model_meta", "start_transfer", "version_kind", "log_rollout"]

log = logging.getLogger(__name__)

JOB_ENV = "ELASTIC_CTR_JOB"
COMMIT_ENV = "ELASTIC_CTR_GIT_COMMIT"
#: the job's figures per partition (continuous) or per pass (batch: ``test_auc``)
JOB_METRICS = ("auc_before", "logloss_before", "partition_rows", "test_auc", "quarantined")
#: the longest tag value written (MLflow accepts 8000 characters)
TAG_MAX = 4000
#: a trainer's own figures per partition or pass (and, batch, its totals without a step)
TRAINER_METRICS = ("train_auc", "loss", "trainer_rows", "seconds", "examples_per_s")
#: the job's figures per exported version (at the partition's step)
EXPORT_METRICS = ("export_rows", "export_seconds", "version_id")
#: the transfer's figures per version (step = the version id)
TRANSFER_METRICS = ("rollout_seconds", "landed_to_served_seconds", "building_seconds", "deploying_seconds",
                    "downloading_seconds", "reloading_seconds", "enabling_seconds")


def job_name(cfg=None, start_hour: Optional[str] = None) -> str:
    """The job's name: ``$ELASTIC_CTR_JOB``, else ``online-<start hour>`` for a continuous
    job (``cfg.start_hour`` or ``start_hour``), else ``train-<UTC time>``."""
    env = os.environ.get(JOB_ENV, "").strip()
    if env:
        return env
    hour = start_hour or (cfg.start_hour if cfg is not None and cfg.mode == "continuous" else None)
    if hour:
        return f"online-{hour.replace('/', '-')}"
    return f"train-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def code_version() -> Optional[str]:
    """The code's git commit: ``$ELASTIC_CTR_GIT_COMMIT``, else ``git rev-parse HEAD`` of the
    checkout this package runs from, else None (an image built without it)."""
    env = os.environ.get(COMMIT_ENV, "").strip()
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def _flat(v: Any) -> Any:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


class JobTracking:
    """What one training process logs: ``job`` (the job's run: a ``Tracker`` on trainer 0,
    a ``NullTracker`` elsewhere) and ``trainer`` (this trainer's child run). Made by
    ``start_training``; every method only enqueues."""

    def __init__(self, job, trainer):
        self.job, self.trainer = job, trainer

    def partition(self, step: int, part, loss: Optional[float], partition_rows: Optional[int],
                  location: Optional[str] = None) -> None:
        """One trained partition (``runtime.formats.train_result.PartitionResult``) at
        ``step``: ``auc_before`` and ``partition_rows`` (every trainer's rows) in the job's
        run with the partition at ``location`` as a dataset; the trainer's own figures in
        its run."""
        self.job.log_metrics({"auc_before": part.auc_before, "logloss_before": part.logloss_before,
                              "partition_rows": partition_rows, "quarantined": 0}, step=step)
        if location:
            digest = hashlib.md5(f"{location}:{partition_rows}".encode()).hexdigest()[:8]
            self.job.log_inputs([(part.hour, location, digest, "training")])
        eps = part.rows / part.seconds if part.seconds else None
        self.trainer.log_metrics({"train_auc": part.train_auc, "loss": finite(loss), "trainer_rows": part.rows,
                                  "seconds": part.seconds, "examples_per_s": eps}, step=step)

    def quarantine(self, step: int, hour: str, anomalies: list[str]) -> None:
        """A partition the data gate refused (``runtime.trainer.data_gate``): ``quarantined``
        = 1 at ``step`` and the tag ``partition.<YYYYMMDD-HH>.quarantined`` (its anomalies,
        ``; ``-joined, at most ``TAG_MAX`` characters) in the job's run."""
        self.job.log_metrics({"quarantined": 1}, step=step)
        text = "; ".join(anomalies) or "quarantined"
        self.job.set_tags({f"partition.{hour.replace('/', '-')}.quarantined": text[:TAG_MAX]})

    def training_pass(self, step: int, st, test_auc: Optional[float]) -> None:
        """One pass of a batch job (``runtime.trainer.passes.PassStats``): ``test_auc`` in
        the job's run (trainer 0), the trainer's figures in its run."""
        self.job.log_metrics({"test_auc": test_auc}, step=step)
        self.trainer.log_metrics({"train_auc": st.train_auc, "loss": finite(st.loss), "trainer_rows": st.examples,
                                  "examples_per_s": st.examples_per_s, "seconds": st.seconds}, step=step)

    def version(self, step: Optional[int], rec: Mapping[str, Any], model_meta: Optional[dict]) -> None:
        """One exported version: ``rec`` = ``{"id", "kind", "base", "hour", "rows",
        "seconds"}`` (``runtime.trainer.online_state.ExportRecord``; batch: ``hour`` None):
        ``EXPORT_METRICS`` at ``step``, the ``version.<id>.*`` tags (``version.<id>.onnx``:
        ``model.onnx``, or ``none: <why>``, from ``model_meta``'s ``onnx``) and the artifact
        (``rec`` with ``model_meta``)."""
        vid = rec["id"]
        self.job.log_metrics({"export_rows": rec.get("rows"), "export_seconds": rec.get("seconds"),
                              "version_id": vid}, step=step)
        tags = {f"version.{vid}.kind": rec.get("kind"), f"version.{vid}.base": rec.get("base"),
                f"version.{vid}.hour": rec.get("hour")}
        onnx = (model_meta or {}).get("onnx")
        if onnx:  # the ONNX copy (runtime.trainer.onnx_export): its file, or why there is none
            tags[f"version.{vid}.onnx"] = (onnx["file"] if onnx.get("file") else
                                           f"none: {onnx.get('error')}")[:TAG_MAX]
        self.job.set_tags(tags)
        self.job.log_dict({**dict(rec), "model_meta": model_meta}, f"versions/{vid}.json")

    def totals(self, figures: Mapping[str, Optional[float]]) -> None:
        """A batch trainer's totals (examples, seconds, rates) in its run, without a step."""
        self.trainer.log_metrics(figures)

    def close(self, status: str = "FINISHED", timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ends both runs (``Tracker.close``), waiting at most ``timeout_s`` for both together."""
        deadline = time.monotonic() + timeout_s
        self.trainer.close(timeout_s=timeout_s, status=status)
        self.job.close(timeout_s=max(0.1, deadline - time.monotonic()), status=status)


def start_training(cfg, job: Mapping[str, Any], uri: Optional[str] = None) -> JobTracking:
    """The runs of one trainer process of a training job (module docstring).

    Args:
        cfg: the job's ``runtime.trainer.config.TrainConfig`` (params of the job's run).
        job: the record's job fields: ``mode`` (``ps``/``single``), ``trainers``,
            ``pservers``, ``trainer_id`` (PS; absent = 0).
        uri: the tracking URI (default: ``$MLFLOW_TRACKING_URI``; none: nothing logged).

    A continuous job keeps its runs' ids under ``cfg.state_dir`` (resume: same runs)."""
    uri = tracking_uri(uri)
    if not uri:
        return JobTracking(NullTracker(), NullTracker())
    tid = int(job.get("trainer_id") or 0)
    name = job_name(cfg)
    keep = cfg.mode == "continuous" and cfg.state_dir

    def rfile(n: str) -> Optional[RunIdFile]:
        return RunIdFile(cfg.state_dir, n) if keep else None

    parent: Any = NullTracker()
    if tid == 0:
        commit = code_version()
        parent = Tracker(uri, name, tags={ROLE_TAG: "job", JOB_TAG: name, "elastic_ctr.mode": cfg.mode,
                                          **({COMMIT_TAG: commit} if commit else {})}, run_id_file=rfile("job"))
        params = {k: _flat(v) for k, v in cfg.model_dump().items() if v is not None}
        params.update(trainers=job.get("trainers"), pservers=job.get("pservers"), job_mode=job.get("mode"))
        parent.log_params(params)
    if tid == 0:  # the job's run is this process's: its id once made
        parent_id = lambda: parent.run_id  # noqa: E731
    elif keep:  # trainer 0 keeps it on the job's shared state directory
        parent_id = lambda: RunIdFile(cfg.state_dir, "job").read(uri)  # noqa: E731
    else:  # a batch job: the newest run of the job's name (runtime.tracking_client)
        parent_id = None
    trainer = Tracker(uri, f"{name}-trainer{tid}", tags={ROLE_TAG: "trainer", JOB_TAG: name,
                                                        "elastic_ctr.trainer_id": tid, "elastic_ctr.mode": cfg.mode},
                      run_id_file=rfile(f"trainer-{tid}"), parent_job=name, parent_id=parent_id)
    return JobTracking(parent, trainer)


def partition_step(start_hour: str, hour: str, minutes: int = 60) -> int:
    """A continuous job's step: partitions of ``minutes`` from ``start_hour`` to ``hour``
    (partition names, ``runtime.formats.partitions``)."""
    from runtime.formats.partitions import Partition

    a, b = Partition.parse(start_hour, minutes=minutes), Partition.parse(hour, minutes=minutes)
    return int((b.start - a.start).total_seconds() // (60 * minutes))


def finite(v: Optional[float]) -> Optional[float]:
    """``v`` when it is a finite number, else None (MLflow takes no NaN loss)."""
    import math

    return v if v is not None and math.isfinite(v) else None


def published_model_meta(output: Optional[str], version: int) -> Optional[dict]:
    """The ``model_meta.json`` of ``version`` as published under ``output`` (a local root
    or URL; ``runtime.formats.donefile.dense_dir``), for the version's artifact; None when
    there is no output or it cannot be read (warned: tracking never fails a job)."""
    if not output:
        return None
    from runtime import storage
    from runtime.formats import donefile, model_meta

    where = storage.join(output, donefile.dense_dir(version), model_meta.FILE)
    try:
        return json.loads(storage.read_bytes(where))
    except (OSError, ValueError) as exc:
        log.warning("tracking: %s not read (%s); the version's artifact has no model_meta", where, exc)
        return None


# -- what the cube transfer logs (module docstring) ---------------------------------------
def start_transfer(work_dir: str, dict_name: str, uri: Optional[str] = None) -> "Tracker | NullTracker":
    """The cube transfer's run (``transfer-<dict>``, its id kept in
    ``<work_dir>/tracking/transfer.json`` so a restarted transfer continues it), a child of
    the job's run when ``$ELASTIC_CTR_JOB`` names the job."""
    uri = tracking_uri(uri)
    if not uri:
        return NullTracker()
    job = os.environ.get(JOB_ENV, "").strip() or None
    tags = {ROLE_TAG: "transfer", "elastic_ctr.dict": dict_name, **({JOB_TAG: job} if job else {})}
    return Tracker(uri, f"transfer-{dict_name}", tags=tags, run_id_file=RunIdFile(str(work_dir), "transfer"),
                   parent_job=job)


def version_kind(mode: str) -> str:
    """A version's kind as the donefiles say it: ``base`` or ``patch`` (the builder's
    ``delta`` mode is a patch)."""
    return "patch" if mode in ("delta", "patch") else "base"


def log_rollout(tr, version: int, mode: str, seconds: float, phases: Mapping[str, float],
                landed_to_served_s: Optional[float] = None) -> None:
    """One finished rollout, step = the version id: ``rollout_seconds``,
    ``landed_to_served_seconds`` (when its donefile line says when its data landed) and
    ``<phase>_seconds`` for each phase (``runtime.cube.transfer.state.Phase`` values, lower
    case: ``building``, ``deploying``, ``downloading``, ``reloading``, ``enabling``), and the
    tag ``version.<id>.kind`` (``version_kind(mode)``)."""
    tr.log_metrics({"rollout_seconds": seconds, "landed_to_served_seconds": landed_to_served_s,
                    **{f"{k.lower()}_seconds": s for k, s in phases.items()}}, step=int(version))
    tr.set_tags({f"version.{int(version)}.kind": version_kind(mode)})
