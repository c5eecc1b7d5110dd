"""Least privilege in the rendered stack: a ServiceAccount per workload with no API
token, the namespace enforcing the restricted Pod Security Standard, a Secret per trust
boundary (generated, or the user's; the previous one kept during a rotation) mounted exactly
where a role's spec lists it, and nothing exposed without source ranges."""
from __future__ import annotations

import pytest

from components import common
from infra.config import ConfigError
from infra.render import REDACTED, dump, run_program, stack_config, to_manifest
from runtime import role_specs
from runtime.role_specs import CREDENTIALS_DIR, CREDENTIALS_DIR_ENV, CUBE_CONTROL, FILES_READ, FILES_WRITE, TRACKING

_SIG_KEY, _SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def pods(r) -> dict[str, dict]:
    """name -> pod spec of every workload (each task of the Volcano Job as ``ctr-train-<task>``)."""
    out = {m.name: m.body["spec"]["template"]["spec"] for m in r.manifests if m.kind in ("Deployment", "StatefulSet")}
    for task in r.get("Job", "ctr-train")["spec"]["tasks"]:
        out[f"ctr-train-{task['name']}"] = task["template"]["spec"]
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_workload_runs_as_its_own_service_account_without_a_token(rendered, stack):
    r = rendered(stack)
    accounts = {}
    for name, pod in pods(r).items():
        assert pod["automountServiceAccountToken"] is False, name
        sa = r.get("ServiceAccount", pod["serviceAccountName"])
        assert sa["automountServiceAccountToken"] is False, name
        accounts.setdefault(pod["serviceAccountName"], []).append(name)
    # shared only by the StatefulSets of the cube's shards
    assert {a: n for a, n in accounts.items() if len(n) > 1} == {
        "cube": sorted(n for n in pods(r) if n.startswith("cube-") and n != "cube-transfer")}
    assert len(r.by_kind("ServiceAccount")) == len(accounts)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_namespace_enforces_the_restricted_pod_security_standard(rendered, stack):
    (ns,) = rendered(stack).by_kind("Namespace")
    labels = ns.body["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_a_secret_per_trust_boundary_generated_and_kept_secret(rendered):
    r = rendered("dev")
    secrets = {m.name: m.body for m in r.by_kind("Secret") if m.name.startswith("credentials-")}
    assert secrets == {
        f"credentials-{b}": secrets[f"credentials-{b}"] for b in (CUBE_CONTROL, FILES_WRITE, FILES_READ, TRACKING)}
    for b in (CUBE_CONTROL, FILES_WRITE, FILES_READ):
        assert secrets[f"credentials-{b}"]["stringData"] == {"current": REDACTED}
    assert secrets[f"credentials-{TRACKING}"]["stringData"] == {
        "username": REDACTED, "password": REDACTED, "server-secret-key": REDACTED}
    # generated where the user set none (uploadToken is FILES_WRITE's), each a secret Output end to end
    generated = {x["name"] for x in r.resources if x["type"] == "random:index/randomPassword:RandomPassword"}
    assert generated == {f"credentials-{b}" for b in (CUBE_CONTROL, FILES_READ, TRACKING)} | {
        f"credentials-{TRACKING}-server"}
    for x in r.resources:
        if x["type"] == "kubernetes:core/v1:Secret" and x["name"].startswith("credentials-"):
            assert x["inputs"]["stringData"][_SIG_KEY] == _SECRET_SIG, x["name"]
    # every boundary whatever the stack deploys (a role's spec lists what it may use)
    store = rendered("dev", "modelRoot=s3://b/m", "dataSource=s3://b/h", "trainingMode=continuous",
                     "dataStartHour=20261120/00", "trackingServer=false")
    assert {m.name for m in store.by_kind("Secret")} == set(secrets)


def test_user_credentials_and_a_rotation_stay_secret():
    sets = ["cubeControlToken=user-cube-token-0123456789", "cubeControlTokenPrevious=old-cube-token-0123456789"]
    config, secrets = stack_config("dev", sets)
    secrets |= {"elastic-ctr:cubeControlToken", "elastic-ctr:cubeControlTokenPrevious"}
    resources, _ = run_program(config, secrets, "dev")
    manifests = [m for m in (to_manifest(x) for x in resources) if m]
    text = "".join(dump(m.body) for m in manifests)
    assert "user-cube-token" not in text and "old-cube-token" not in text
    (sec,) = [m.body for m in manifests if m.name == f"credentials-{CUBE_CONTROL}" and m.kind == "Secret"]
    assert sec["stringData"] == {"current": REDACTED, "previous": REDACTED}
    assert not [x for x in resources if x["type"].startswith("random:") and x["name"] == f"credentials-{CUBE_CONTROL}"]


@pytest.mark.parametrize("sets, message", [
    (["cubeControlTokenPrevious=old-cube-token-0123456789"], "cubeControlTokenPrevious: \\[secret\\] is set without "
                                                             "cubeControlToken"),
    (["cubeControlToken=short"], "cubeControlToken: \\[secret, 5 characters\\] is invalid"),
    (["exposeFileServer=true"], "fileServerSourceRanges: '' is invalid; allowed: comma-separated CIDRs \\(required "
                                "when exposeFileServer is true"),
    (["exposeFileServer=true", "fileServerSourceRanges=10.0.0.1/8"], "fileServerSourceRanges: '10.0.0.1/8' is invalid"),
])
def test_bad_security_config_is_named(sets, message):
    config, secrets = stack_config("dev", sets)
    secrets |= {f"elastic-ctr:{s.split('=')[0]}" for s in sets if "Token" in s}
    with pytest.raises(ConfigError, match=message):
        run_program(config, secrets, "dev")


def test_prod_publishes_nothing(rendered):
    r = rendered("prod")
    assert [m.name for m in r.by_kind("Service") if m.body["spec"].get("type") == "LoadBalancer"] == []


def _spec(credentials: tuple[str, ...]) -> role_specs.RoleSpec:
    base = role_specs.cube_agent("/data/agent")
    return role_specs.RoleSpec(base.name, base.args, base.ports, base.readiness, base.liveness, base.env,
                               base.metrics, credentials)


def test_a_container_mounts_exactly_the_credentials_its_spec_lists():
    dep = common.DeployContext(namespace="ns", instance="i", credentials={
        b: f"credentials-{b}" for b in (CUBE_CONTROL, FILES_READ, FILES_WRITE)})
    spec = _spec((CUBE_CONTROL, FILES_READ))
    c = common.container(spec, dep, "img", resources_=common.resources("1", "1Gi"))
    mounts = [(m.name, m.mount_path, m.read_only) for m in c.volume_mounts]
    assert mounts == [(f"credentials-{b}", f"{CREDENTIALS_DIR}/{b}", True) for b in (CUBE_CONTROL, FILES_READ)]
    assert [(e.name, e.value) for e in c.env if e.name == CREDENTIALS_DIR_ENV] == [(CREDENTIALS_DIR_ENV, CREDENTIALS_DIR)]
    # two containers of one pod needing one boundary: one volume; files readable by the owner only
    vols = common.credential_volumes(dep, spec, _spec((CUBE_CONTROL,)))
    assert [(v.name, v.secret.secret_name, v.secret.default_mode, v.secret.items) for v in vols] == [
        (f"credentials-{CUBE_CONTROL}", f"credentials-{CUBE_CONTROL}", 0o400, None),
        (f"credentials-{FILES_READ}", f"credentials-{FILES_READ}", 0o400, None)]
    # the tracking login only: the MLflow server's own secret is not a file of a client's pod
    tracking = common.DeployContext(namespace="ns", instance="i", credentials={TRACKING: f"credentials-{TRACKING}"})
    (v,) = common.credential_volumes(tracking, _spec((TRACKING,)))
    assert [(i.key, i.path) for i in v.secret.items] == [("username", "username"), ("password", "password")]
    # none listed: nothing mounted, no variable
    bare = common.container(_spec(()), dep, "img", resources_=common.resources("1", "1Gi"))
    assert bare.volume_mounts == [] and not [e for e in bare.env if e.name == CREDENTIALS_DIR_ENV]
    assert common.credential_volumes(dep, _spec(())) == []
    with pytest.raises(ValueError, match=r"cube-agent: no Secret for the credentials \['tracking'\]"):
        common.container(_spec((TRACKING,)), dep, "img", resources_=common.resources("1", "1Gi"))


def test_rendered_pods_mount_what_their_specs_list(rendered):
    """Whatever the role specs list today, each rendered container mounts exactly those
    boundaries (and its pod declares their Secret volumes)."""
    r = rendered("dev")
    for name, pod in pods(r).items():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            mounted = [m["mountPath"].rsplit("/", 1)[1] for m in c.get("volumeMounts", [])
                       if m["mountPath"].startswith(CREDENTIALS_DIR + "/")]
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert (CREDENTIALS_DIR_ENV in env) == bool(mounted), (name, c["name"])
            for b in mounted:
                secret = dict(volumes[f"credentials-{b}"]["secret"])
                items = secret.pop("items", None)
                assert secret == {"secretName": f"credentials-{b}", "defaultMode": 256}
                assert items == ([{"key": k, "path": k} for k in ("username", "password")] if b == TRACKING else None)
