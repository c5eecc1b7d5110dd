"""``elastic-ctr train --local-cluster``: P pservers + T trainers as processes on 127.0.0.1.

Each role is ``python -m runtime.cli train <same flags>`` with the environment contract of
``runtime.trainer.roles`` (free ports, a metrics port each: their scrape targets are
written where ``runtime.local.targets`` says). The launcher checks the inputs first (a missing
file or unreachable URL fails before any process starts), starts the pservers, then the
trainers, waits for the trainers, and stops the pservers (by PID). If any role dies, every
process is stopped and ``RoleFailed`` (with the failing role's log tail) is raised.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Callable

from runtime import proc, role_specs
from runtime.local import targets
from runtime.formats.train_result import RESULT, TrainResult, TrainResultError
from runtime.trainer import PADDLE_FLAGS
from runtime.trainer.config import TrainConfig
from runtime.trainer.input_checks import check_inputs

log = logging.getLogger(__name__)


def run_local_ps(cfg: TrainConfig, pservers: int = 1, trainers: int = 2,
                      log_dir: str | None = None, timeout_s: float | None = None,
                      on_started: Callable[[list[str], list[int]], None] | None = None) -> dict:
    """Runs the job; returns trainer 0's result record (``test_auc``, ``version``, ...)
    plus ``wall_seconds``, ``log_dir`` and the totals (``job_totals``), the fields of
    ``runtime.formats.train_result.TrainResult`` as a dict. ``on_started(pserver_endpoints, trainer_pids)``
    is called once every role is started (benchmarks sample the trainers' sockets).
    Raises ``proc.RoleFailed`` / ``TimeoutError``."""
    if pservers < 1 or trainers < 1:
        raise ValueError(f"--pservers and --trainers must be >= 1 (got {pservers}, {trainers})")
    check_inputs(cfg)
    t0 = time.monotonic()
    logs = Path(log_dir or tempfile.mkdtemp(prefix="elastic-ctr-cluster-"))
    *ports, gloo_port = proc.free_ports(pservers + 1)
    metrics_ports = proc.free_ports(pservers + trainers)
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    from runtime import tracking

    common = {**PADDLE_FLAGS, "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(endpoints), "PADDLE_TRAINERS_NUM": str(trainers),
              "POD_IP": "127.0.0.1", "OMP_NUM_THREADS": "1", "CPU_NUM": "1",
              tracking.JOB_ENV: tracking.job_name(cfg)}  # one job name for every process (its runs)
    args = role_specs.train_argv(cfg)
    log.info("local cluster: %d pserver(s) %s, %d trainer(s); logs in %s", pservers, endpoints, trainers, logs)
    with proc.ProcessGroup(logs) as group:
        ps_roles = []
        for i, p in enumerate(ports):
            spec = role_specs.ps_role("pserver", p, gloo_port, args, metrics_port=metrics_ports[i],
                                      metrics_host=role_specs.LOOPBACK)
            ps_roles.append(group.start(f"pserver-{i}", spec.argv(), env={**common, **dict(spec.env)}))
            targets.register(spec, f"pserver-{i}", {"pserver": str(i)})
        tr_roles = []
        for i in range(trainers):  # a trainer's PADDLE_PORT is the pservers' (the endpoints are given)
            spec = role_specs.ps_role("trainer", ports[0], gloo_port, args, metrics_port=metrics_ports[pservers + i],
                                      metrics_host=role_specs.LOOPBACK)
            tr_roles.append(group.start(f"trainer-{i}", spec.argv(),
                                        env={**common, **dict(spec.env), "PADDLE_TRAINER_ID": str(i)},
                                        expect_exit=True))
            targets.register(spec, f"trainer-{i}", {"trainer": str(i)})
        if on_started is not None:
            on_started(endpoints, [r.proc.pid for r in tr_roles])
        group.wait(tr_roles, timeout_s=timeout_s)
        for r in ps_roles:  # as Volcano's CompleteJob: SIGTERM, then SIGKILL after the grace period
            group.stop(r)
        pserver_exit_codes = [r.proc.returncode for r in ps_roles]
    # a trainer stopped by a signal before the end prints no line (nothing exported)
    found = [_result(logs / f"trainer-{i}.log") for i in range(trainers)]
    per_trainer = [r for r in found if r is not None]
    rec = found[0].to_dict() if found[0] is not None else {}
    rec.update(wall_seconds=round(time.monotonic() - t0, 2), log_dir=str(logs), pserver_exit_codes=pserver_exit_codes,
               **job_totals(per_trainer))
    return rec


def _result(log_path: Path) -> TrainResult | None:
    """A trainer's ``ELASTIC_CTR_RESULT`` record from its log (None if it printed none).
    Raises ``RuntimeError`` naming the log when the line is malformed."""
    try:
        return TrainResult.find(log_path.read_text(errors="replace"), RESULT, source=str(log_path))
    except TrainResultError as exc:
        raise RuntimeError(str(exc)) from None


def job_totals(per_trainer: list[TrainResult]) -> dict:
    """The job's rate from every trainer's record: ``examples_total`` (sum of their
    ``examples``), ``examples_per_s_total`` (over the slowest trainer's ``train_seconds``)
    and ``examples_per_s_with_load_total`` (over the slowest ``train_seconds +
    load_seconds``); rates are 0.0 when no trainer reports seconds."""
    examples = sum(r.examples or 0 for r in per_trainer)
    train_s = max((r.train_seconds or 0.0 for r in per_trainer), default=0.0)
    with_load_s = max(((r.train_seconds or 0.0) + (r.load_seconds or 0.0) for r in per_trainer), default=0.0)
    return {"examples_total": examples,
            "examples_per_s_total": round(examples / train_s, 1) if train_s else 0.0,
            "examples_per_s_with_load_total": round(examples / with_load_s, 1) if with_load_s else 0.0}
