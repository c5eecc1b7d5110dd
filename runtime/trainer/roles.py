"""Training roles from the environment (contract in docs/contracts.md).

Paddle's ``PaddleCloudRoleMaker`` reads ``TRAINING_ROLE`` (PSERVER|TRAINER),
``PADDLE_PSERVERS_IP_PORT_LIST`` (comma-separated host:port), ``PADDLE_TRAINERS_NUM``,
``PADDLE_TRAINER_ID`` (trainers), ``POD_IP`` and ``PADDLE_PORT`` (pservers: their own
endpoint, which must be one of the list).

In a Volcano Job the ``svc`` plugin sets ``VC_<TASK>_HOSTS`` (comma-separated pod host
names of a task, e.g. ``VC_PSERVER_HOSTS``) and ``VC_<TASK>_NUM``, and the ``env`` plugin
sets ``VC_TASK_INDEX`` (the pod's index within its task). Whatever ``PADDLE_*`` variable is
not set explicitly is derived from those:

* endpoints = ``<host>:<PADDLE_PORT or 8200>`` for each host of ``VC_PSERVER_HOSTS``;
* ``PADDLE_TRAINERS_NUM`` = ``VC_TRAINER_NUM``;
* ``PADDLE_TRAINER_ID`` = ``VC_TASK_INDEX`` (trainers);
* a pserver's ``POD_IP`` = the ``VC_TASK_INDEX``-th host of ``VC_PSERVER_HOSTS`` (so its
  endpoint matches the list exactly).

``TRAINING_ROLE`` itself is never guessed: the pod spec of each task sets it.

Gloo (Paddle's collective barriers, which the table saves and loads wait on) rendezvouses
over an HTTP key-value store that pserver 0 starts: ``PADDLE_WITH_GLOO=1``,
``PADDLE_GLOO_RENDEZVOUS=3`` (HTTP) and ``PADDLE_GLOO_HTTP_ENDPOINT`` =
``<pserver 0's host>:<PADDLE_GLOO_PORT or 8210>`` are set for every role unless given.
Without gloo, Paddle 3.0.0's ``fleet.util.barrier()`` only warns, and trainer 0 would save
the table while the other trainers still push.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from runtime import role_specs

#: the pods' ports (``runtime.role_specs.PORTS``): a variable not set falls back to them
DEFAULT_PORT = role_specs.PORTS["pserver"]["paddle"]
DEFAULT_GLOO_PORT = role_specs.PORTS["pserver"]["gloo"]
ROLE_VARS = ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM",
             "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT", "PADDLE_GLOO_HTTP_ENDPOINT")


class RoleError(ValueError):
    """The environment does not describe a valid role; the message names the variable."""


@dataclass(frozen=True)
class RoleConfig:
    """A resolved role: ``role`` ("PSERVER"|"TRAINER"), ``pservers`` (host:port list),
    ``trainers`` (count), ``trainer_id`` (0-based; 0 for pservers), ``pod_ip``, ``port``,
    ``gloo_endpoint`` (host:port of pserver 0's gloo store)."""

    role: str
    pservers: tuple[str, ...]
    trainers: int
    trainer_id: int
    pod_ip: str
    port: int
    gloo_endpoint: str = ""

    @property
    def is_pserver(self) -> bool:
        return self.role == "PSERVER"

    @property
    def endpoint(self) -> str:
        """This pserver's own endpoint ``pod_ip:port``."""
        return f"{self.pod_ip}:{self.port}"

    def env(self) -> dict[str, str]:
        """The ``PADDLE_*`` environment Paddle's role maker reads."""
        return {
            "TRAINING_ROLE": self.role,
            "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(self.pservers),
            "PADDLE_TRAINERS_NUM": str(self.trainers),
            "PADDLE_TRAINER_ID": str(self.trainer_id),
            "POD_IP": self.pod_ip,
            "PADDLE_PORT": str(self.port),
            "PADDLE_WITH_GLOO": "1",
            "PADDLE_GLOO_RENDEZVOUS": "3",
            "PADDLE_GLOO_HTTP_ENDPOINT": self.gloo_endpoint,
        }


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise RoleError(f"{name}={env[name]!r} is not an integer") from None


def from_env(env: Mapping[str, str] | None = None) -> RoleConfig:
    """Resolves the role from ``env`` (default ``os.environ``), Volcano variables filling
    in unset ``PADDLE_*`` ones. Raises ``RoleError`` naming the missing or bad variable."""
    env = dict(os.environ if env is None else env)
    role = env.get("TRAINING_ROLE", "").strip().upper()
    if role not in ("PSERVER", "TRAINER"):
        raise RoleError(f"TRAINING_ROLE={env.get('TRAINING_ROLE')!r}: expected PSERVER or TRAINER")
    port = _int(env, "PADDLE_PORT") if env.get("PADDLE_PORT") else DEFAULT_PORT
    vc_hosts = [h.strip() for h in env.get("VC_PSERVER_HOSTS", "").split(",") if h.strip()]
    if env.get("PADDLE_PSERVERS_IP_PORT_LIST"):
        pservers = [p.strip() for p in env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",") if p.strip()]
    elif vc_hosts:
        pservers = [f"{h}:{port}" for h in vc_hosts]
    else:
        raise RoleError("PADDLE_PSERVERS_IP_PORT_LIST is not set (nor VC_PSERVER_HOSTS)")
    for ep in pservers:
        host, sep, p = ep.rpartition(":")
        if not sep or not host or not p.isdigit():
            raise RoleError(f"PADDLE_PSERVERS_IP_PORT_LIST: {ep!r} is not host:port")
    if env.get("PADDLE_GLOO_HTTP_ENDPOINT"):
        gloo = env["PADDLE_GLOO_HTTP_ENDPOINT"].strip()
        host, sep, p = gloo.rpartition(":")
        if not sep or not host or not p.isdigit():
            raise RoleError(f"PADDLE_GLOO_HTTP_ENDPOINT={gloo!r} is not host:port")
    else:
        gloo_port = _int(env, "PADDLE_GLOO_PORT") if env.get("PADDLE_GLOO_PORT") else DEFAULT_GLOO_PORT
        gloo = f"{pservers[0].rpartition(':')[0]}:{gloo_port}"
    if env.get("PADDLE_TRAINERS_NUM"):
        trainers = _int(env, "PADDLE_TRAINERS_NUM")
    elif env.get("VC_TRAINER_NUM"):
        trainers = _int(env, "VC_TRAINER_NUM")
    else:
        raise RoleError("PADDLE_TRAINERS_NUM is not set (nor VC_TRAINER_NUM)")
    if trainers < 1:
        raise RoleError(f"PADDLE_TRAINERS_NUM={trainers}: must be >= 1")
    task_index = _int(env, "VC_TASK_INDEX") if env.get("VC_TASK_INDEX") else None
    if role == "TRAINER":
        if env.get("PADDLE_TRAINER_ID"):
            tid = _int(env, "PADDLE_TRAINER_ID")
        elif task_index is not None:
            tid = task_index
        else:
            raise RoleError("PADDLE_TRAINER_ID is not set (nor VC_TASK_INDEX)")
        if not 0 <= tid < trainers:
            raise RoleError(f"PADDLE_TRAINER_ID={tid}: must be in 0..{trainers - 1}")
        pod_ip = env.get("POD_IP") or "127.0.0.1"
        return RoleConfig(role, tuple(pservers), trainers, tid, pod_ip, port, gloo)
    # PSERVER
    if env.get("POD_IP"):
        pod_ip = env["POD_IP"]
    elif vc_hosts and task_index is not None:
        if not 0 <= task_index < len(vc_hosts):
            raise RoleError(f"VC_TASK_INDEX={task_index}: VC_PSERVER_HOSTS has {len(vc_hosts)} hosts")
        pod_ip = vc_hosts[task_index]
    else:
        raise RoleError("POD_IP is not set (nor VC_PSERVER_HOSTS with VC_TASK_INDEX)")
    cfg = RoleConfig(role, tuple(pservers), trainers, 0, pod_ip, port, gloo)
    if cfg.endpoint not in pservers:
        raise RoleError(f"pserver endpoint {cfg.endpoint} (POD_IP:PADDLE_PORT) is not in "
                        f"PADDLE_PSERVERS_IP_PORT_LIST {','.join(pservers)}")
    return cfg


def apply(cfg: RoleConfig) -> None:
    """Writes the resolved ``PADDLE_*`` variables into ``os.environ`` (for Paddle)."""
    os.environ.update(cfg.env())
