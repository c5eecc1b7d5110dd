"""The long-running roles of ``elastic-ctr local`` and its clients, started the same way by
both flows (``runtime.local.pipeline`` rounds, ``runtime.local.online``): the file server,
the cube and the transfer (``runtime.local.cube.LocalCubeCluster`` in the run's process
group), serving, and the demo client (``elastic-ctr client``).
"""
from __future__ import annotations

import json
from pathlib import Path

from runtime import role_specs


class Services:
    """What ``start_services`` started: ``cube`` (the ``LocalCubeCluster``: file server, cube,
    transfer), ``root_url`` (the file server, or the ``--model-root`` store location),
    ``fs_root`` (the file server's root directory; None with a store ``--model-root``),
    ``root`` (where versions and donefiles are: ``fs_root`` or the store location),
    ``token_file`` (the upload token), ``topology`` (topology.json path), ``transfer_url``,
    and, once ``start_serving`` started it, the ports serving bound: ``serving_port`` (HTTP),
    ``grpc_port``, and ``serving_url`` (None before)."""

    def __init__(self, cube, fs_root: Path):
        self.cube = cube
        self.fs_root = None if cube.store else fs_root
        self.root = str(cube.root)
        self.root_url = cube.root_url
        self.token_file = cube.token_file
        self.topology = cube.topology_path
        self.transfer_url = cube.transfer_url
        self.serving_port: int | None = None
        self.grpc_port: int | None = None
        self.serving_url: str | None = None


def start_services(args, run_dir: Path, group) -> Services:
    """Generates the run's credentials (``run_dir/credentials/<boundary>/current``, files
    0600, ``runtime.auth.write_credentials``; the upload token is ``fileserver-write``'s) and
    points this process's environment at them (``$ELASTIC_CTR_CREDENTIALS_DIR``), so every
    role the run starts reads them; starts the file server (root ``run_dir/fileserver``; none when
    ``args.model_root`` is an object-store location: versions go there),
    ``args.cube_shards`` x ``args.cube_replicas`` cube servers with their agents, and the cube
    transfer (work dirs under ``run_dir/cube``), each a process of ``group`` on 127.0.0.1;
    waits until every port answers. Raises ``proc.RoleFailed`` / ``TimeoutError``."""
    import os

    from runtime import auth
    from runtime.local.cube import LocalCubeCluster

    fs_root = run_dir / "fileserver"
    model_root = getattr(args, "model_root", None)
    creds = auth.write_credentials(run_dir / "credentials")
    os.environ.update(auth.env_for(creds))  # the trainer, serving and clients this run starts inherit it
    cube = LocalCubeCluster(run_dir / "cube", model_root or fs_root, shards=args.cube_shards, replicas=args.cube_replicas,
                            dict_name=role_specs.DICT_NAME, poll_interval_s=0.2, start_timeout_s=120.0, group=group,
                            credentials_dir=creds)
    cube.start()
    return Services(cube, fs_root)


def start_serving(args, run_dir: Path, group, svc: Services, fmt: str, slot_args: list[str] = ()):
    """Starts ``elastic-ctr serve`` (``args.serving_workers`` workers x
    ``args.serving_threads`` threads, rows in format ``fmt``) following the transfer of
    ``svc`` on the ports it binds (the ports of its previous start, if any: its clients keep
    their URL); waits until its HTTP and gRPC ports accept (120 s) and sets ``svc``'s
    ``serving_port``, ``grpc_port`` and ``serving_url``. Returns the ``proc.Role``. Raises
    ``proc.RoleFailed`` / ``TimeoutError``."""
    spec = role_specs.serving(str(svc.topology), svc.root_url, svc.transfer_url, str(run_dir / "serving"),
                              role_specs.LOOPBACK, svc.serving_port or 0, svc.grpc_port or 0,
                              workers=args.serving_workers, threads=args.serving_threads, data_format=fmt,
                              poll_interval_s=0.2, extra=list(slot_args))
    serving = group.start("serving", spec.argv(), port_file=True)
    bound = group.bound_ports(serving, 120)
    from runtime.local import targets

    targets.register(spec.with_ports(bound), "serving")
    svc.serving_port, svc.grpc_port = bound["http"], bound["grpc"]
    svc.serving_url = f"http://{role_specs.LOOPBACK}:{svc.serving_port}"
    return serving


class Client:
    """One run of the demo client (``elastic-ctr client``) as role ``name``: its result
    (the client's ``--json-out``) at ``run_dir/<name>.json``, its predictions (``row\\tlabel
    \\tprob\\tversion`` lines, ``--predictions-out``) at ``run_dir/<name>.tsv``."""

    def __init__(self, role, json_path: Path, predictions: Path):
        self.role, self.json_path, self.predictions = role, json_path, predictions

    def result(self) -> dict:
        """The client's JSON result (``requests``, ``failed_requests``, ``qps``, ``p50_ms``,
        ``p99_ms``, ``versions``, ``auc``, ``rows_scored``, ...); after it exited."""
        return json.loads(self.json_path.read_text())


def start_client(run_dir: Path, group, name: str, url: str, data: Path, fmt: str, concurrency: int,
                 batch: int, extra: list[str] = (), slot_args: list[str] = ()) -> Client:
    """Starts the demo client against serving at ``url`` on the rows of ``data`` (format
    ``fmt``): ``concurrency`` workers, ``batch`` rows per request, plus the client flags
    ``extra``. Returns the ``Client`` (wait for ``client.role``, then read ``result()``)."""
    from runtime import proc

    out, pred = run_dir / f"{name}.json", run_dir / f"{name}.tsv"
    role = group.start(name, proc.self_command() + [
        "client", "--url", url, "--data", str(data), "--format", fmt, "--concurrency", str(concurrency),
        "--batch-size", str(batch), "--json-out", str(out), "--predictions-out", str(pred)]
        + list(slot_args) + list(extra), expect_exit=True)
    return Client(role, out, pred)
