"""A local cube cluster as processes on 127.0.0.1: file server, S shards x R replicas
(cube server + agent each) and the transfer. Used by ``elastic-ctr local``
(``runtime.local``), the rollout end-to-end tests and ``bench/bench_rollout.py``; every
process runs the same ``elastic-ctr`` subcommands as the pods, is supervised by
``runtime.proc.ProcessGroup`` and stopped by PID on exit.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime import auth, proc, role_specs, storage
from runtime.local import targets
from runtime.formats.dict_info import DictInfo, DictInfoError, fetch_dict_info
from runtime.formats import donefile
from runtime.formats.topology import Topology


@dataclass
class CubeLayout:
    """A cube layout's processes (``LocalCubeCluster.start_layout``): ``shards`` x
    ``replicas``, role-name ``prefix``, ``topology`` / ``topology_path``, ``servers`` /
    ``agents`` (``(shard, replica)`` -> ``proc.Role``), ``addresses`` (``(shard, replica)``
    -> the topology's ``(server, http, agent)``)."""

    shards: int
    replicas: int
    prefix: str
    topology: Topology | None = None
    topology_path: Path | None = None
    servers: dict[tuple[int, int], proc.Role] = field(default_factory=dict)
    agents: dict[tuple[int, int], proc.Role] = field(default_factory=dict)
    addresses: dict[tuple[int, int], tuple[str, str, str]] = field(default_factory=dict)


class LocalCubeCluster:
    """Starts the cluster in ``base_dir``; use as a context manager.

    Args:
        base_dir: scratch directory (agent/transfer work dirs, topology.json; logs in
            ``base_dir/logs`` unless ``group`` is given).
        root: version root served by the file server (the trainer's export target), or an
            object-store location (``s3://bucket/prefix``): then no file server is started,
            the transfer reads and publishes there and the agents download from there
            (``root_url`` is that location).
        shards, replicas: topology size.
        dict_name: cube dict name.
        poll_interval_s: the transfer's donefile poll interval (s).
        root_mode: ``"url"``: the transfer reads ROOT through the file server (listing,
            token PUT uploads); ``"dir"``: it reads the directory and agents download
            through the file server (``--publish-url``).
        token: the upload bearer token: the ``fileserver-write`` credential written when
            the cluster writes the credentials.
        credentials_dir: the run's credentials (``runtime.auth``: ``<dir>/<boundary>/current``);
            default ``base_dir/credentials``; when it holds no ``cube-control`` credential yet,
            one credential per boundary is generated there (files 0600). Every role started
            gets ``$ELASTIC_CTR_CREDENTIALS_DIR`` pointing at it (``env``).
        start_timeout_s: how long each port may take to answer (s).
        extra_transfer_args: more ``cube transfer`` flags.
        group: a ``proc.ProcessGroup`` to start the roles in (the caller stops it); default:
            the cluster's own, stopped on exit.
    Roles (log ``<name>.log``): ``fileserver``, ``cube-server-<s>-<r>``, ``cube-agent-<s>-<r>``,
    ``cube-transfer``; a layout started beside (``start_layout``, a resize's new
    shard count) ``cube-<N>s-server-<s>-<r>``, ``cube-<N>s-agent-<s>-<r>``.
    Attributes after ``start()``: ``topology`` (``Topology``), ``topology_path``, ``root_url``,
    ``transfer_url``, ``token_file`` (the ``fileserver-write`` credential's file), ``env``
    (the roles' credentials environment), ``credentials_dir``, ``group``, ``servers``/``agents`` (``(shard, replica)``
    -> ``proc.Role``), ``transfer``, ``layout`` (the first ``CubeLayout``).
    """

    def __init__(self, base_dir: str | Path, root: str | Path, shards: int = 2, replicas: int = 2,
                 dict_name: str = role_specs.DICT_NAME, poll_interval_s: float = 0.2, root_mode: str = "url",
                 token: str = "test-token", start_timeout_s: float = 60.0, extra_transfer_args=(),
                 group: proc.ProcessGroup | None = None, credentials_dir: str | Path | None = None):
        self.base = Path(base_dir)
        self.store = storage.is_store(str(root))
        self.root = str(root) if self.store else Path(root)
        self.shards, self.replicas, self.dict_name = shards, replicas, dict_name
        self.poll_interval_s, self.root_mode, self.token = poll_interval_s, root_mode, token
        self.start_timeout_s = start_timeout_s
        self.extra_transfer_args = list(extra_transfer_args)
        self._own_group = group is None
        self.group = proc.ProcessGroup(self.base / "logs", grace_s=5.0) if group is None else group
        self.topology: Topology | None = None
        self.servers: dict[tuple[int, int], proc.Role] = {}
        self.agents: dict[tuple[int, int], proc.Role] = {}
        self.transfer: proc.Role | None = None
        self.layout: CubeLayout | None = None
        self.root_url: str | None = None
        self.credentials_dir = Path(credentials_dir) if credentials_dir else self.base / "credentials"
        self.env = auth.env_for(self.credentials_dir)
        self.token_file = self.credentials_dir / role_specs.FILES_WRITE / role_specs.CREDENTIAL_CURRENT

    def version_root(self) -> str | None:
        """Where the agents may download from: ``<publish location>/cube/`` (the file
        server's URL, or the store location); None before ``start()`` started the file
        server (a layout started alone: its agents then take any published URL)."""
        if self.store:
            return storage.join(str(self.root), "cube/")
        return f"{self.root_url}/cube/" if self.root_url else None

    def control(self) -> auth.Credential:
        """The ``cube-control`` credential of the cluster (for a client of its agents and servers)."""
        return auth.Credential(role_specs.CUBE_CONTROL, self.credentials_dir)

    def __enter__(self) -> "LocalCubeCluster":
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._own_group:
            self.group.stop_all()

    def _start(self, name: str, spec: role_specs.RoleSpec) -> proc.Role:
        """Starts ``spec`` (its ports 0: the role binds them) as role ``name``."""
        return self.group.start(name, spec.argv(), env=self.env, port_file=True)

    def _ports(self, role: proc.Role) -> dict[str, int]:
        """The ports ``role`` bound (``runtime.bound_ports``), once it accepts on them."""
        return self.group.bound_ports(role, self.start_timeout_s)

    def start(self) -> None:
        """Starts every role, each on ports it binds itself, and waits until each accepts.
        Raises ``proc.RoleFailed`` (a role exited) or ``TimeoutError``."""
        self.base.mkdir(parents=True, exist_ok=True)
        if not self.store:
            self.root.mkdir(parents=True, exist_ok=True)
        auth.write_credentials(self.credentials_dir, values={role_specs.FILES_WRITE: self.token})
        if self.store:
            self.root_url = str(self.root)
        else:
            spec = role_specs.file_server(str(self.root), role_specs.LOOPBACK, 0)
            fs = self._start("fileserver", spec)
            fs_port = self._ports(fs)["http"]
            targets.register(spec.with_ports({"http": fs_port}), "fileserver")
            self.root_url = f"http://{role_specs.LOOPBACK}:{fs_port}"
        gen = self.start_layout(self.shards, self.replicas, prefix="cube", topology_name="topology.json")
        self.topology, self.topology_path = gen.topology, gen.topology_path
        self.servers, self.agents, self.layout = gen.servers, gen.agents, gen
        root_arg = self.root_url if self.root_mode == "url" or self.store else str(self.root)
        publish = self.root_url if self.root_mode != "url" and not self.store else None
        self._transfer_spec = role_specs.cube_transfer(
            str(self.topology_path), root_arg, str(self.base / "transfer"), role_specs.LOOPBACK, 0,
            poll_interval_s=self.poll_interval_s, publish_url=publish,
            extra=["--phase-timeout-seconds", "120", *self.extra_transfer_args])
        self.transfer = self._start("cube-transfer", self._transfer_spec)
        tr_port = self._ports(self.transfer)["http"]
        # a restart binds the same port again: serving and clients keep the transfer's URL
        self._transfer_spec = self._with_arg(self._transfer_spec, "--port", str(tr_port)).with_ports({"http": tr_port})
        targets.register(self._transfer_spec, "cube-transfer")
        self.transfer_url = f"http://{role_specs.LOOPBACK}:{tr_port}"

    @staticmethod
    def _with_arg(spec: role_specs.RoleSpec, flag: str, value: str) -> role_specs.RoleSpec:
        args = list(spec.args)
        args[args.index(flag) + 1] = value
        return dataclasses.replace(spec, args=tuple(args))

    def start_layout(self, shards: int, replicas: int, prefix: str | None = None,
                         topology_name: str | None = None) -> CubeLayout:
        """Starts a cube layout of ``shards`` x ``replicas`` (server + agent each, the
        servers with ``--shard-num shards``, empty) beside what runs, as a new
        ``cubeShards`` creates new StatefulSets, and writes its topology
        (``base_dir/<topology_name>``, default ``topology-<shards>s.json``); waits until
        every port answers. Roles ``<prefix>-server-<s>-<r>`` / ``<prefix>-agent-<s>-<r>``
        (default prefix ``cube-<shards>s``), agent work dirs ``<prefix>-agent-<s>-<r>``.
        The transfer is not told: ``restart_transfer(gen.topology_path)``. Raises
        ``ValueError`` for fewer than one shard or replica, ``proc.RoleFailed``,
        ``TimeoutError``."""
        if shards < 1 or replicas < 1:
            raise ValueError(f"a layout needs >= 1 shard and replica, got {shards} x {replicas}")
        gen = CubeLayout(shards, 0, prefix or f"cube-{shards}s")
        self.grow_layout(gen, replicas, topology_name or f"topology-{shards}s.json")
        return gen

    def grow_layout(self, gen: CubeLayout, replicas: int, topology_name: str | None = None) -> Path:
        """Adds replicas to every shard of ``gen`` up to ``replicas`` (new replicas
        empty, as a StatefulSet scaled up by a new ``cubeReplicas``), writes the grown
        topology (``base_dir/<topology_name>``, default ``topology-<shards>s-<replicas>r.json``)
        and returns its path; waits until every new port answers. The transfer is not
        told: ``restart_transfer(path)`` (it reconciles the new replicas at start). Raises
        ``ValueError`` when ``replicas`` is not above the current count."""
        if replicas <= gen.replicas:
            raise ValueError(f"grow_layout: {replicas} replicas is not more than {gen.replicas}")
        auth.write_credentials(self.credentials_dir, values={role_specs.FILES_WRITE: self.token})  # kept if written
        agent_dir = "agent" if gen.prefix == "cube" else f"{gen.prefix}-agent"
        new = [(s, r) for s in range(gen.shards) for r in range(gen.replicas, replicas)]
        servers = {}
        for s, r in new:  # every server first, each binding its ports; then an agent beside each
            work = str(self.base / f"{agent_dir}-{s}-{r}")
            spec = role_specs.cube_server(s, gen.shards, role_specs.LOOPBACK, 0, 0, dict_name=self.dict_name,
                                          load_roots=[work])
            servers[(s, r)] = spec, work, self._start(f"{gen.prefix}-server-{s}-{r}", spec)
        agents = {}
        for (s, r), (spec, work, srv) in servers.items():
            bound = self._ports(srv)
            targets.register(spec.with_ports(bound), srv.name, {"replica": str(r)})
            root = self.version_root()
            agent = role_specs.cube_agent(work, bound["http"], role_specs.LOOPBACK, 0,
                                          version_roots=[root] if root else [])
            agents[(s, r)] = agent, bound, self._start(f"{gen.prefix}-agent-{s}-{r}", agent)
            gen.servers[(s, r)] = srv
        for (s, r), (agent, bound, ag) in agents.items():
            aport = self._ports(ag)["agent"]
            targets.register(agent.with_ports({"agent": aport}), ag.name, {"replica": str(r)})
            gen.agents[(s, r)] = ag
            gen.addresses[(s, r)] = role_specs.replica_addresses(role_specs.LOOPBACK, bound["data"], bound["http"],
                                                                 aport)
        gen.replicas = replicas
        gen.topology = Topology.build(self.dict_name, [[gen.addresses[(s, r)] for r in range(replicas)]
                                                       for s in range(gen.shards)])
        gen.topology_path = gen.topology.write(
            self.base / (topology_name or f"topology-{gen.shards}s-{replicas}r.json"))
        return gen.topology_path

    def shrink_layout(self, gen: CubeLayout, replicas: int,
                          topology_name: str | None = None) -> tuple[Path, dict[str, int]]:
        """Stops the replicas of ``gen`` above ``replicas`` (highest ordinal first, as a
        StatefulSet scaled down: SIGTERM, lookups received answered), writes the shrunk
        topology (default name ``topology-<shards>s-<replicas>r.json``). Returns its path
        and the stopped roles' exit codes. Raises ``ValueError`` unless ``1 <= replicas <
        gen.replicas``."""
        if not 1 <= replicas < gen.replicas:
            raise ValueError(f"shrink_layout: {replicas} replicas, expected 1..{gen.replicas - 1}")
        codes = {}
        for r in range(gen.replicas - 1, replicas - 1, -1):
            for s in range(gen.shards):
                # the agent first: stopped after its server, it kept retrying a reload the
                # transfer had asked for against the gone server and outlived its grace
                for roles in (gen.agents, gen.servers):
                    role = roles.pop((s, r))
                    self.group.stop(role)
                    codes[role.name] = role.proc.returncode
                    if role in self.group.roles:
                        self.group.roles.remove(role)
                del gen.addresses[(s, r)]
        gen.replicas = replicas
        gen.topology = Topology.build(self.dict_name, [[gen.addresses[(s, r)] for r in range(replicas)]
                                                       for s in range(gen.shards)])
        gen.topology_path = gen.topology.write(
            self.base / (topology_name or f"topology-{gen.shards}s-{replicas}r.json"))
        return gen.topology_path, codes

    def stop_layout(self, gen: CubeLayout) -> dict[str, int]:
        """Stops a layout's servers and agents (SIGTERM, by PID; each lookup received
        is answered first), as pulumi deletes the StatefulSets that left the program.
        Returns each role's exit code by name."""
        codes = {}
        for role in list(gen.agents.values()) + list(gen.servers.values()):  # agents first (shrink_layout)
            self.group.stop(role)
            codes[role.name] = role.proc.returncode
            if role in self.group.roles:
                self.group.roles.remove(role)
        return codes

    def restart_transfer(self, topology_path: str | Path | None = None) -> None:
        """Stops the transfer (SIGTERM, by PID) and starts it again with the same work dir;
        with ``topology_path``, on that topology (a resize's new layout, or more
        replicas)."""
        self.group.stop(self.transfer)
        self.group.roles.remove(self.transfer)
        if topology_path is not None:
            self._transfer_spec = self._with_arg(self._transfer_spec, "--topology", str(topology_path))
        self.transfer = self._start("cube-transfer", self._transfer_spec)
        self._ports(self.transfer)

    def info(self) -> DictInfo:
        """The transfer's ``/dict/info``. Raises ``DictInfoError`` (naming the URL)."""
        return fetch_dict_info(self.transfer_url, timeout_s=5)

    def wait_version(self, version: int, timeout_s: float = 120.0, poll_s: float = 0.05) -> float:
        """Blocks until the transfer reports ``version`` served by every replica; returns
        the monotonic time it was seen. Raises ``TimeoutError`` (with the transfer's last
        ``/dict/info``) or ``RoleFailed`` if a process died."""
        deadline = time.monotonic() + timeout_s
        info: DictInfo | str | None = None
        while time.monotonic() < deadline:
            self.group.check()
            try:
                info = self.info()
            except DictInfoError as exc:
                info = str(exc)
            if isinstance(info, DictInfo) and info.version == version:
                return time.monotonic()
            time.sleep(poll_s)
        raise TimeoutError(f"version {version} not served after {timeout_s:.0f} s; transfer says {info}; "
                           f"transfer log:\n{proc.tail(self.transfer.log_path if self.transfer else None)}")

    def publish_version(self, vid: int, key: int, patch: bool = False, dim: int | None = None,
                        count: int | None = None) -> None:
        """Appends the donefile line of version ``vid`` at the standard paths (its files
        must already be under ``root/versions/<vid>/sparse``), as the trainer's export does:
        last. A base's ``key`` is its own id; a patch's, its base's. Raises ``ValueError``
        for a base with another key."""
        if patch:
            donefile.append(str(self.root), "patch", donefile.patch_record(vid, key, dim, count))
        elif key != vid:
            raise ValueError(f"base {vid}: key {key}, expected its own id")
        else:
            donefile.append(str(self.root), "base", donefile.base_record(vid, dim, count))
