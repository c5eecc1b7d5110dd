"""Each rendered pod runs exactly its role's spec (``runtime.role_specs``): container name,
``args``, named ports and probes; and every spec's command line parses with the real
``elastic-ctr`` parser, so a spec can never pass a flag the role does not take."""
from __future__ import annotations

import pytest

from components import common, cube_transfer, file_server, training_job
from runtime import role_specs
from runtime.cli import build_parser
from runtime.trainer.config import TrainConfig

STACKS = [("dev",), ("prod",), ("dev", "cubeShards=3", "cubeReplicas=1")]


def _probe(p: dict | None):
    """A rendered probe as a ``role_specs.Probe`` (None when absent)."""
    if not p:
        return None
    if "httpGet" in p:
        return role_specs.Probe(p["httpGet"]["port"], p["httpGet"]["path"])
    return role_specs.Probe(p["tcpSocket"]["port"])


def _check(container: dict, spec: role_specs.RoleSpec) -> None:
    assert container["name"] == spec.name
    assert container["args"] == list(spec.args)
    assert [(p["name"], p["containerPort"]) for p in container.get("ports", [])] == list(spec.ports)
    assert _probe(container.get("readinessProbe")) == spec.readiness
    assert _probe(container.get("livenessProbe")) == spec.liveness
    fixed = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert all(fixed.get(k) == v for k, v in spec.env), (container["name"], spec.env)


def _containers(manifest: dict) -> list[dict]:
    spec = manifest["spec"]
    return spec["template"]["spec"]["containers"]


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "-".join(s))
def test_every_rendered_role_runs_its_spec(rendered, stack):
    r = rendered(*stack)
    outputs = r.outputs
    topo = outputs["cubeTopology"]
    shard_num = len(topo["shards"])
    checked = set()
    root = outputs["fileServerClusterUrl"]
    for sts in r.by_kind("StatefulSet"):
        name = sts.body["metadata"]["name"]
        shard = int(name.rsplit("-", 1)[1])
        server, agent = _containers(sts.body)
        _check(server, role_specs.cube_server(shard, shard_num, data_dir="/data/server", load_roots=["/data/agent"]))
        _check(agent, role_specs.cube_agent("/data/agent", version_roots=[root.rstrip("/") + "/cube/"]))
        checked |= {"cube-server", "cube-agent"}
    for dep in r.by_kind("Deployment"):
        (c,) = _containers(dep.body)
        if c["name"] == "cube-transfer":
            _check(c, role_specs.cube_transfer(common.TOPOLOGY_FILE, root, cube_transfer.STATE_DIR,
                                               poll_interval_s=float(c["args"][c["args"].index("--poll-seconds") + 1])))
        elif c["name"] == "fileserver":
            _check(c, role_specs.file_server(file_server.ROOT))
        elif c["name"] == "serving":
            a = c["args"]
            _check(c, role_specs.serving(common.TOPOLOGY_FILE, root, outputs["transferStatusUrl"].removesuffix("/dict/info"),
                                         f"{common.TMP_DIR}/models", workers=a[a.index("--workers") + 1],
                                         data_format=a[a.index("--format") + 1],
                                         dense_backend=a[a.index("--dense-backend") + 1]))
        elif c["name"] == "mlflow":
            _check(c, role_specs.tracking_server(basic_auth=True))
        else:
            pytest.fail(f"a Deployment container with no role spec: {c['name']}")
        checked.add(c["name"])
    (job,) = r.by_kind("Job")
    for task in job.body["spec"]["tasks"]:
        (c,) = task["template"]["spec"]["containers"]
        _check(c, role_specs.ps_role(task["name"], args=c["args"]))
        assert c["args"][0] == "train"
        checked.add(task["name"])
    assert checked == {"cube-server", "cube-agent", "cube-transfer", "fileserver", "serving", "mlflow",
                       "pserver", "trainer"}


def test_the_topology_names_the_roles_ports(rendered):
    """The topology's addresses carry the cube server's and agent's spec ports."""
    topo = rendered("dev").outputs["cubeTopology"]
    for shard in topo["shards"]:
        for rep in shard["replicas"]:
            host = rep["server"].rsplit(":", 1)[0]
            assert (rep["server"], rep["http"], rep["agent"]) == role_specs.replica_addresses(host)


def _local_specs(tmp) -> list[role_specs.RoleSpec]:
    """Every role as the local pipeline starts it (loopback, free ports, files)."""
    return [
        role_specs.file_server(str(tmp), role_specs.LOOPBACK, 18080, upload_token_file=str(tmp / "t")),
        role_specs.cube_server(1, 2, role_specs.LOOPBACK, 18900, 18901, data_dir=str(tmp / "d"),
                               extra=["--io-mode", "threads"]),
        role_specs.cube_agent(str(tmp / "a"), 18901, role_specs.LOOPBACK, 18902),
        role_specs.cube_transfer(str(tmp / "topology.json"), "http://127.0.0.1:18080", str(tmp / "w"),
                                 role_specs.LOOPBACK, 18910, poll_interval_s=0.2, upload_token_file=str(tmp / "t"),
                                 publish_url="http://127.0.0.1:18080", extra=["--phase-timeout-seconds", "120"]),
        role_specs.serving(str(tmp / "topology.json"), "http://127.0.0.1:18080", "http://127.0.0.1:18910",
                           str(tmp / "s"), role_specs.LOOPBACK, 18000, 0, workers=2, threads=1, poll_interval_s=0.2,
                           extra=["--slot-file", str(tmp / "slots")]),
        role_specs.ps_role("pserver", 18200, 18210, role_specs.train_argv(TrainConfig(data_train=(str(tmp / "x"),), data_test=(str(tmp / "y"),)))),
    ]


def test_every_spec_parses_with_the_real_command_line(tmp_path):
    deployed = [role_specs.file_server(file_server.ROOT), role_specs.cube_server(0, 1, data_dir="/data/server"),
                role_specs.cube_agent("/data/agent"),
                role_specs.cube_transfer(common.TOPOLOGY_FILE, "http://f:8080", cube_transfer.STATE_DIR),
                role_specs.serving(common.TOPOLOGY_FILE, "http://f:8080", "http://t:8910", "/tmp/models"),
                role_specs.serving(common.TOPOLOGY_FILE, "http://f:8080", "http://t:8910", "/tmp/models",
                                   dense_backend="paddle")]
    for spec in deployed + _local_specs(tmp_path):
        args = build_parser(spec.args[0]).parse_args([str(a) for a in spec.args])
        port = getattr(args, "port", None)
        if port is not None:  # the flag the role listens on is the spec's first port
            assert port == spec.ports[0][1], spec.name
    assert training_job.TABLE_DIR.startswith(training_job.SHARED_DIR)


def test_specs_refuse_what_no_role_takes():
    with pytest.raises(ValueError, match="shard 2 is not in"):
        role_specs.cube_server(2, 2)
    with pytest.raises(ValueError, match="task"):
        role_specs.ps_role("worker")
    with pytest.raises(KeyError, match="no port 'grpc'"):
        role_specs.file_server("/r").port("grpc")
    with pytest.raises(TypeError, match="not strings"):
        role_specs.cube_transfer("/t", object(), "/w").argv()
    no_grpc = role_specs.serving("/t", "r", "u", "/w", grpc=False)
    assert no_grpc.ports == (("http", 8000),) and "--no-grpc" in no_grpc.args and "--grpc-port" not in no_grpc.args
    # port 0: the role binds a free port itself (runtime.bound_ports)
    assert role_specs.serving("/t", "r", "u", "/w", port=0, grpc_port=0).ports == (("http", 0), ("grpc", 0))
    assert role_specs.cube_agent("/a", 0, port=0).args[2:6] == ("--host", "0.0.0.0", "--port", "0")
