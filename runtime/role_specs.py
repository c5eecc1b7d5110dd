"""One spec per long-running role: the ``elastic-ctr`` command line it runs, its ports, its
probes and its fixed environment.

The Pulumi components (``components/``: each pod's container), the local pipeline and the
local cube cluster (``runtime.local``, ``runtime.local.cube``: processes on
127.0.0.1), the benchmarks and the tests build every role from a ``RoleSpec`` made here,
so a flag, a port number, a probe path or the dict name is written once. A spec's
``args`` are what follows ``elastic-ctr`` (a pod's container ``args``; a process's argv
after ``proc.self_command()``); ``tests/infra`` checks that each rendered pod's command is
its spec's and that every spec parses with the real command line.

Ports: each role's default port numbers are the pods' (``PORTS``); local processes pass
free ones. A role's ``metrics`` names where Prometheus scrapes it (a named port and
``/metrics``): the ServiceMonitors, PodMonitors and scrape annotations of the stack
(``components/monitoring.py``) and the local Prometheus's targets
(``runtime.local.targets``) are built from it. Every value of ``args`` is a ``str``, or, from a component, a ``pulumi.Input``
of one (a location known only at deploy time): this module never looks inside them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

#: the cube dict every role of the pipeline serves (Paddle Serving's cube names a table a dict)
DICT_NAME = "ctr_embedding"

#: the pods' port numbers, by role and port name; probes and Services name the ports
PORTS: dict[str, dict[str, int]] = {
    "fileserver": {"http": 8080},
    "cube-server": {"data": 8900, "http": 8901},
    "cube-agent": {"agent": 8902},
    "cube-transfer": {"http": 8910},
    "serving": {"http": 8000, "grpc": 8001},
    "pserver": {"paddle": 8200, "gloo": 8210, "metrics": 8220},
    "trainer": {"paddle": 8200, "metrics": 8220},
    "tracking": {"http": 5000},
}

#: every address a pod listens on
ANY_HOST = "0.0.0.0"
#: where a local process listens, and where a cube agent reaches the server beside it
LOOPBACK = "127.0.0.1"

#: probe paths of the control roles (``runtime.web.wsgi``), of serving (the v2 protocol) and of
#: the MLflow server
HEALTHZ, READYZ = "/healthz", "/readyz"
V2_LIVE, V2_READY = "/v2/health/live", "/v2/health/ready"
TRACKING_HEALTH = "/health"
#: where every role of the pipeline answers Prometheus' scrape (its text exposition format)
METRICS_PATH = "/metrics"
#: the training processes' metrics port (``runtime.metrics.trainer``; 0 or unset: none) and
#: the address it listens on (a pod's every address; a local process's 127.0.0.1: given in
#: the environment, as every other role's bind address is given in its arguments)
METRICS_PORT_ENV, METRICS_HOST_ENV = "ELASTIC_CTR_METRICS_PORT", "ELASTIC_CTR_METRICS_HOST"

#: the trust boundaries, each guarded by its own credential: the transfer -> cube servers' control
#: ports and agents; writers (trainer, transfer) -> the file server; readers -> a protected file
#: server; the trainer and the transfer -> MLflow (basic auth)
CUBE_CONTROL, FILES_WRITE, FILES_READ, TRACKING = "cube-control", "fileserver-write", "fileserver-read", "tracking"
CREDENTIAL_BOUNDARIES = (CUBE_CONTROL, FILES_WRITE, FILES_READ, TRACKING)
#: where a role reads its credentials: ``$ELASTIC_CTR_CREDENTIALS_DIR/<boundary>/current`` (and
#: ``previous`` while a rotation rolls out); a pod mounts one Secret per boundary there
CREDENTIALS_DIR_ENV, CREDENTIALS_DIR = "ELASTIC_CTR_CREDENTIALS_DIR", "/var/run/secrets/elastic-ctr"
#: the keys (file names) of a boundary's Secret: the credential a role presents, and the one
#: still accepted while a rotation rolls out (``runtime.auth``)
CREDENTIAL_CURRENT, CREDENTIAL_PREVIOUS = "current", "previous"
#: the ``tracking`` Secret's keys (files): the MLflow user of the pipeline. The MLflow server
#: (``mlflow server --app-name basic-auth``) makes it its admin at first start
#: (``MLFLOW_AUTH_ADMIN_USERNAME`` / ``_PASSWORD``); the trainer and the transfer log in with it
#: (``runtime.tracking_login``)
TRACKING_USERNAME, TRACKING_PASSWORD = "username", "password"


@dataclass(frozen=True)
class Probe:
    """An HTTP GET of ``path`` on the port named ``port`` (``path`` None: a TCP connect)."""

    port: str
    path: Optional[str] = None


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where Prometheus scrapes a role: a GET of ``path`` on the port named ``port``."""

    port: str
    path: str = "/metrics"


@dataclass(frozen=True)
class RoleSpec:
    """How one role runs.

    Attributes:
        name: the role's name (a pod's container name, a local process's log name).
        args: the ``elastic-ctr`` arguments (``str`` or ``pulumi.Input[str]`` each).
        ports: ``(name, number)`` pairs, in the order a pod declares them.
        readiness / liveness: the probes (None: not probed).
        env: fixed environment ``(name, value)`` pairs the role needs (not secrets).
        metrics: where Prometheus scrapes the role (a GET of ``path`` on the port named
            ``port``; None: the role exposes no metrics).
        credentials: the trust boundaries (``CREDENTIAL_BOUNDARIES``) whose credential the
            role reads from ``CREDENTIALS_DIR``, to check it or to present it.
    """

    name: str
    args: tuple[Any, ...]
    ports: tuple[tuple[str, int], ...] = ()
    readiness: Optional[Probe] = None
    liveness: Optional[Probe] = None
    env: tuple[tuple[str, str], ...] = field(default=())
    metrics: Optional[MetricsEndpoint] = None
    credentials: tuple[str, ...] = ()

    def port(self, name: str) -> int:
        """The number of port ``name``. Raises ``KeyError`` naming the role's ports."""
        for n, number in self.ports:
            if n == name:
                return number
        raise KeyError(f"{self.name}: no port {name!r} (has {[n for n, _ in self.ports]})")

    def with_ports(self, bound: dict[str, int]) -> "RoleSpec":
        """This spec with the port numbers a role started on port 0 bound
        (``runtime.bound_ports``: name -> number); its ``args`` unchanged."""
        return replace(self, ports=tuple((n, int(bound.get(n, number))) for n, number in self.ports))

    def argv(self) -> list[str]:
        """The command line of this role as a local process (this interpreter). Raises
        ``TypeError`` when an argument is not a plain string (a deploy-time value)."""
        bad = [a for a in self.args if not isinstance(a, str)]
        if bad:
            raise TypeError(f"{self.name}: arguments {bad!r} are not strings (deploy-time values)")
        return [sys.executable, "-m", "runtime.cli", *self.args]


def _ports(role: str, **numbers: Optional[int]) -> tuple[tuple[str, int], ...]:
    """``role``'s ports in ``PORTS`` order, each number from ``numbers`` when given (0:
    the kernel picks one when the role binds it; ``runtime.bound_ports``)."""
    return tuple((name, int(default if numbers.get(name) is None else numbers[name]))
                 for name, default in PORTS[role].items())


def _control_probes(port: str) -> dict[str, Probe]:
    """A control role's probes and its metrics, all on the HTTP port ``port``."""
    return {"readiness": Probe(port, READYZ), "liveness": Probe(port, HEALTHZ), "metrics": Probe(port, METRICS_PATH)}


def file_server(root: Any, host: str = ANY_HOST, port: Optional[int] = None,
                upload_token_file: Optional[str] = None, read_auth: bool = False) -> RoleSpec:
    """``elastic-ctr fileserver``: serves the directory ``root``; uploads need the bearer
    token (``upload_token_file``, else ``$ELASTIC_CTR_UPLOAD_TOKEN``, else the
    ``FILES_WRITE`` credential); with ``read_auth``, reads need ``FILES_READ``."""
    ports = _ports("fileserver", http=port)
    args = ["fileserver", "--root", root, "--host", host, "--port", str(ports[0][1])]
    if upload_token_file:
        args += ["--upload-token-file", str(upload_token_file)]
    creds = (FILES_WRITE,)
    if read_auth:
        args.append("--read-auth")
        creds += (FILES_READ,)
    return RoleSpec("fileserver", tuple(args), ports, credentials=creds, **_control_probes("http"))


def cube_server(shard: int, shard_num: int, host: str = ANY_HOST, port: Optional[int] = None,
                http_port: Optional[int] = None, data_dir: Optional[str] = None,
                dict_name: str = DICT_NAME, extra: Sequence[str] = (), load_roots: Sequence[Any] = ()) -> RoleSpec:
    """``elastic-ctr cube server``: shard ``shard`` of ``shard_num`` (keys ``key %
    shard_num == shard``), data plane on port ``data``, control and metrics on ``http``;
    ``data_dir`` records the enabled chain (served again after a restart); loads only from
    under ``load_roots`` (``--load-root`` each: the agent's work directory). Raises
    ``ValueError`` for a shard outside ``[0, shard_num)``."""
    if not 0 <= int(shard) < int(shard_num):
        raise ValueError(f"cube server: shard {shard} is not in [0, {shard_num})")
    ports = _ports("cube-server", data=port, http=http_port)
    args = ["cube", "server", "--shard", str(shard), "--shard-num", str(shard_num), "--dict-name", dict_name]
    if data_dir:
        args += ["--data-dir", str(data_dir)]
    for root in load_roots:
        args += ["--load-root", root]
    args += ["--host", host, "--port", str(ports[0][1]), "--http-port", str(ports[1][1]), *extra]
    return RoleSpec("cube-server", tuple(args), ports, credentials=(CUBE_CONTROL,), **_control_probes("http"))


def cube_agent(work_dir: str, server_http_port: Optional[int] = None, host: str = ANY_HOST,
               port: Optional[int] = None, version_roots: Sequence[Any] = ()) -> RoleSpec:
    """``elastic-ctr cube agent``: beside one cube server (the same pod, or the same
    machine: it reaches the server's control port on 127.0.0.1), unpacking into
    ``work_dir``; downloads only under ``version_roots`` (``--version-root`` each: where the
    transfer publishes, ``<root>/cube/``), checks and presents ``CUBE_CONTROL``, reads
    ``FILES_READ`` (a protected file server)."""
    ports = _ports("cube-agent", agent=port)
    http = int(PORTS["cube-server"]["http"] if server_http_port is None else server_http_port)
    args: tuple[Any, ...] = ("cube", "agent", "--host", host, "--port", str(ports[0][1]),
                             "--server-http", f"http://{LOOPBACK}:{http}", "--work-dir", str(work_dir))
    for root in version_roots:
        args += ("--version-root", root)
    return RoleSpec("cube-agent", args, ports, credentials=(CUBE_CONTROL, FILES_READ), **_control_probes("agent"))


def replica_addresses(host: str, server_port: Optional[int] = None, http_port: Optional[int] = None,
                      agent_port: Optional[int] = None) -> tuple[str, str, str]:
    """One cube replica's entry of the topology (``runtime.formats.topology``): ``(data
    plane host:port, control URL, agent URL)`` of the server and agent on ``host``."""
    server = _ports("cube-server", data=server_port, http=http_port)
    agent = _ports("cube-agent", agent=agent_port)
    return f"{host}:{server[0][1]}", f"http://{host}:{server[1][1]}", f"http://{host}:{agent[0][1]}"


def cube_transfer(topology: str, root: Any, work_dir: str, host: str = ANY_HOST, port: Optional[int] = None,
                  poll_interval_s: float = 5.0, upload_token_file: Optional[str] = None,
                  publish_url: Optional[str] = None, pin_version: Optional[int] = None,
                  keep_versions: int = 0, extra: Sequence[str] = ()) -> RoleSpec:
    """``elastic-ctr cube transfer``: watches ``root``'s donefile and rolls each version out
    to every replica of ``topology`` (a topology file); state under ``work_dir``;
    ``pin_version``: the version to serve instead (``--pin-version``; None: follow
    training); ``keep_versions``: published versions kept (``--keep-versions``; 0: all)."""
    ports = _ports("cube-transfer", http=port)
    args = ["cube", "transfer", "--topology", str(topology), "--root", root, "--work-dir", str(work_dir),
            "--host", host, "--port", str(ports[0][1]), "--poll-seconds", _number(poll_interval_s)]
    if upload_token_file:
        args += ["--upload-token-file", str(upload_token_file)]
    if publish_url:
        args += ["--publish-url", publish_url]
    if pin_version is not None:
        args += ["--pin-version", str(int(pin_version))]
    if keep_versions:
        args += ["--keep-versions", str(int(keep_versions))]
    return RoleSpec("cube-transfer", tuple(args) + tuple(extra), ports,
                    credentials=(CUBE_CONTROL, FILES_WRITE, FILES_READ, TRACKING), **_control_probes("http"))


def serving(topology: str, model_root: Any, transfer_url: Any, work_dir: str, host: str = ANY_HOST,
            port: Optional[int] = None, grpc_port: Optional[int] = None, workers: Any = 2,
            threads: Optional[int] = None, data_format: Any = "criteo", slot_file: Any = None,
            poll_interval_s: Optional[float] = None, dense_backend: Optional[str] = None,
            extra: Sequence[str] = (), grpc: bool = True) -> RoleSpec:
    """``elastic-ctr serve``: the Open Inference Protocol v2 on port ``http`` (REST) and,
    with ``grpc``, on ``grpc`` (``--no-grpc`` without), ``workers`` processes, over the cube
    of ``topology`` and the dense models under ``model_root``, following the version
    ``transfer_url``'s ``/dict/info`` names; ``dense_backend``: ``--dense-backend``
    (``runtime.dense_backends``; None: serve's default)."""
    ports = _ports("serving", http=port, grpc=grpc_port)
    if not grpc:
        ports = ports[:1]
    args = ["serve", "--topology", str(topology), "--model-root", model_root, "--transfer-url", transfer_url,
            "--host", host, "--port", str(ports[0][1]),
            *(("--grpc-port", str(ports[1][1])) if grpc else ("--no-grpc",)),
            "--workers", workers if not isinstance(workers, int) else str(workers),
            "--work-dir", str(work_dir), "--format", data_format]
    if threads is not None:
        args += ["--threads", str(threads)]
    if slot_file:
        args += ["--slot-file", slot_file]
    if poll_interval_s is not None:
        args += ["--poll-seconds", _number(poll_interval_s)]
    if dense_backend is not None:
        args += ["--dense-backend", dense_backend]
    return RoleSpec("serving", tuple(args) + tuple(extra), ports, readiness=Probe("http", V2_READY),
                    liveness=Probe("http", V2_LIVE), metrics=MetricsEndpoint("http", METRICS_PATH), credentials=(FILES_READ,))


def tracking_server(host: str = ANY_HOST, port: Optional[int] = None, workers: int = 1,
                    basic_auth: bool = False, backend_store_uri: Optional[str] = None,
                    artifacts_destination: Optional[str] = None) -> RoleSpec:
    """``mlflow server`` (the tracking image's entrypoint is ``mlflow``, not ``elastic-ctr``;
    a local process runs ``python -m mlflow``: ``mlflow_argv``): artifacts served through
    the server, ``workers`` workers; the store and the artifacts where the flags say (a pod
    has them from its environment: a database URI is a secret); with ``basic_auth``,
    MLflow's own authentication (``--app-name basic-auth``: every request but ``/health``
    and the static files needs a login; its admin and CSRF secret from the environment
    ``TRACKING_SERVER_ENV``, filled from the ``TRACKING`` Secret's keys, and its config file,
    ``tracking_auth_config``, from ``TRACKING_AUTH_CONFIG_ENV``: ``runtime.mlflow_auth``)."""
    ports = _ports("tracking", http=port)
    args: tuple[str, ...] = ()
    if backend_store_uri:
        args += ("--backend-store-uri", backend_store_uri)
    if artifacts_destination:
        args += ("--artifacts-destination", artifacts_destination)
    args = ("server", *args, "--serve-artifacts", "--host", host, "--port", str(ports[0][1]), "--workers", str(workers))
    if basic_auth:
        args += ("--app-name", "basic-auth")
    return RoleSpec("mlflow", args, ports, readiness=Probe("http", TRACKING_HEALTH), liveness=Probe("http", TRACKING_HEALTH),
                    credentials=(TRACKING,) if basic_auth else ())


def mlflow_argv(spec: RoleSpec) -> list[str]:
    """The command line of the MLflow server ``spec`` (``tracking_server``) as a local process
    of this interpreter. Raises ``TypeError`` for a deploy-time argument."""
    return [sys.executable, "-m", "mlflow", *spec.argv()[3:]]


def data_generate(out: Any, rows: Optional[int] = None, test_rows: Optional[int] = None, seed: Optional[int] = None,
                  hours: Optional[int] = None, start: Optional[str] = None, partition_minutes: Optional[int] = None,
                  extra_days: Optional[int] = None) -> tuple[Any, ...]:
    """``elastic-ctr data generate``'s arguments (``runtime.trainer.generator``): ``rows``
    training and ``test_rows`` test rows into ``out``; with ``hours``, that many partitions
    of ``partition_minutes`` from ``start`` (``YYYYMMDD/HH``); ``extra_days`` more days of
    traffic; flags left None take the command's defaults."""
    args: tuple[Any, ...] = ("data", "generate")
    for name, value in (("--hours", hours), ("--start", start), ("--partition-minutes", partition_minutes),
                        ("--rows", rows), ("--test-rows", test_rows), ("--seed", seed), ("--extra-days", extra_days)):
        if value is not None:
            args += (name, str(value))
    return args + ("--out", out)


def train_argv(cfg: Any, launch: Sequence[str] = (), **deploy_time: Any) -> list[Any]:
    """``elastic-ctr train``'s arguments running ``cfg`` (a ``runtime.trainer.config.TrainConfig``):
    ``train``, the ``launch`` flags (how it runs, outside the training settings:
    ``--local-cluster --pservers P --trainers T --log-dir D``, ``--single``,
    ``--tracking-uri U``; a pod's process takes none), then a flag per setting (the data,
    model, cadence and output; the data gate's and the lifecycle's where they differ from
    their defaults). ``deploy_time``: settings known only when the stack deploys (a
    ``pulumi.Input`` each, e.g. ``output``), written in place of ``cfg``'s value. The
    one builder of the command line: the components, the local runs, the local cluster's
    children, the benches and the tests use it; ``elastic-ctr train`` parses it back into
    an equal ``TrainConfig``."""
    from runtime.trainer.flags import flag
    from runtime.trainer.gate_config import gate_argv
    from runtime.trainer.lifecycle import lifecycle_argv

    def value(name: str) -> Any:
        return deploy_time[name] if name in deploy_time else getattr(cfg, name)

    argv: list[Any] = ["train", *launch]
    if cfg.data_train:
        argv += ["--data-train", *cfg.data_train]
    if cfg.data_test:
        argv += ["--data-test", *cfg.data_test]
    argv += ["--format", cfg.format, "--epochs", str(cfg.epochs), "--batch-size", str(cfg.batch_size),
             "--lr", repr(float(cfg.lr)), "--embedding-dim", str(cfg.embedding_dim),
             "--layers", ",".join(str(x) for x in cfg.layers), "--pserver-table-shards", str(cfg.pserver_table_shards),
             "--log-every-s", str(cfg.log_every_s), "--seed", str(cfg.seed), "--threads", str(cfg.threads),
             "--mode", cfg.mode, "--ps-mode", cfg.ps_mode]
    if cfg.ps_mode == "geo":
        argv += ["--geo-k-steps", str(cfg.geo_k_steps), "--geo-table-rows", str(cfg.geo_table_rows)]
    if cfg.mode == "continuous" or cfg.data_root:
        argv += ["--poll-seconds", str(cfg.poll_seconds), "--partition-minutes", str(cfg.partition_minutes),
                 "--patch-every-seconds", str(cfg.patch_every_seconds),
                 "--base-every-minutes", str(cfg.base_every_minutes),
                 "--checkpoint-every-minutes", str(cfg.checkpoint_every_minutes)]
    if cfg.max_bad_lines is not None:
        argv += ["--max-bad-lines", str(cfg.max_bad_lines)]
    if cfg.max_bad_fraction is not None:
        argv += ["--max-bad-fraction", str(cfg.max_bad_fraction)]
    for name in ("slot_file", "output", "upload_token_file", "test_limit", "dump_predictions", "table_dir",
                 "work_dir", "data_root", "start_hour", "end_hour", "state_dir"):
        v = value(name)
        if v is not None:
            argv += [flag(name), v if name in deploy_time else str(v)]
    return argv + gate_argv(cfg) + lifecycle_argv(cfg)


def ps_role(task: str, paddle_port: Optional[int] = None, gloo_port: Optional[int] = None,
            args: Sequence[Any] = (), metrics_port: Optional[int] = None,
            metrics_host: Optional[str] = None) -> RoleSpec:
    """A training process, ``task`` ``pserver`` or ``trainer``, running ``elastic-ctr``
    ``args`` (``train ...``: ``train_argv``) with the environment
    contract's fixed part (``TRAINING_ROLE``, ``PADDLE_PORT``, ``PADDLE_GLOO_PORT``;
    ``runtime.trainer.roles`` derives the rest) and its metrics port
    (``METRICS_PORT_ENV``: ``runtime.metrics.trainer`` serves ``/metrics`` there, on
    ``metrics_host``, default every address: ``METRICS_HOST_ENV``). A pserver
    is probed by a TCP connect on ``paddle``; a trainer, which completes, is not. Raises
    ``ValueError`` for another task."""
    if task not in ("pserver", "trainer"):
        raise ValueError(f"task: {task!r} is not 'pserver' or 'trainer'")
    paddle = int(paddle_port or PORTS[task]["paddle"])
    gloo = int(gloo_port or PORTS["pserver"]["gloo"])
    ports = _ports(task, paddle=paddle, gloo=gloo, metrics=metrics_port)
    env = (("TRAINING_ROLE", task.upper()), ("PADDLE_PORT", str(paddle)), ("PADDLE_GLOO_PORT", str(gloo)),
           (METRICS_PORT_ENV, str(dict(ports)["metrics"])), (METRICS_HOST_ENV, metrics_host or ANY_HOST))
    probe = Probe("paddle") if task == "pserver" else None
    # a trainer reads its data and writes its export (trainer 0) and logs to MLflow; a pserver
    # reads the data a trainer gives it and nothing else
    creds = (FILES_WRITE, FILES_READ, TRACKING) if task == "trainer" else ()
    return RoleSpec(task, tuple(args), ports, readiness=probe, liveness=probe, env=env,
                    metrics=MetricsEndpoint("metrics", METRICS_PATH), credentials=creds)


def _number(value: float) -> str:
    """A flag's number as the command line spells it (``5.0`` -> ``5``, ``0.2`` -> ``0.2``)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
