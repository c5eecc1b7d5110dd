"""The role images as `make images` builds them (scripts/build-images.sh, the Dockerfile's
targets) and as pods run them: each exists and has a bounded size, each role's entrypoint
starts as the non-root user 10001 on a read-only root file system, the images run as 10001
by default, and the targets built are the ones the Pulumi Images component declares."""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.containers.conftest import BUILD_TIMEOUT, EXTRA_TARGETS, REPO, ROLES, SCRIPTS, report_size

pytestmark = [pytest.mark.containers, pytest.mark.slow,
              # the first test's setup builds the images (minutes on a cold cache)
              pytest.mark.timeout(BUILD_TIMEOUT + 600)]

#: upper bounds on the image sizes (bytes), above what they measured (trainer 1417 MB, cube
#: 438 MB, serving 487 MB, serving-paddle 1335 MB, tracking 1020 MB on the local Debian base): the
#: cube and serving images carry no Paddle
MAX_SIZE = {"trainer": 1_800_000_000, "cube": 500_000_000, "serving": 750_000_000, "tracking": 1_500_000_000,
            "serving-paddle": 2_000_000_000}

#: what a pod's container runs (the same `elastic-ctr` entrypoint and subcommands)
RUNS = [
    ("trainer", ["--help"]),
    ("trainer", ["train", "--help"]),
    ("trainer", ["python", "-c", "import paddle"]),
    ("trainer", ["python", "-c", "import paddle2onnx, onnx, onnxruntime"]),  # each version's model.onnx
    ("cube", ["--help"]),
    ("cube", ["cube", "server", "--help"]),
    ("cube", ["fileserver", "--help"]),
    ("serving", ["--help"]),
    ("serving", ["serve", "--help"]),
    # ONNX Runtime runs the dense network: no Paddle in the serving image, Paddle in serving-paddle
    ("serving", ["python", "-c", "import onnxruntime, importlib.util as u; assert u.find_spec('paddle') is None"]),
    ("serving-paddle", ["--help"]),
    ("serving-paddle", ["python", "-c", "import onnxruntime, paddle"]),
    # MLflow's client only where the roles log (mlflow-skinny: no pandas, no server)
    ("trainer", ["python", "-c", "import mlflow, importlib.util as u; assert u.find_spec('pandas') is None"]),
    ("cube", ["python", "-c", "import mlflow, importlib.util as u; assert u.find_spec('pandas') is None"]),
    ("tracking", ["server", "--help"]),
]
#: how the pods' security context runs them: non-root, read-only root file system, /tmp writable
POD_LIKE = ["run", "--rm", "--network", "host", "--read-only", "--tmpfs", "/tmp", "--user", "10001:10001"]


def test_build_uses_the_targets_the_pulumi_images_component_declares():
    """components/images.py, run under Pulumi's mocks, builds --target <role> of the repository's
    Dockerfile with the repository root as context; build-images.sh builds the same targets of the
    same Dockerfile, and tags them as the component names its local (unpushed) images."""
    from components.images import ROLES as COMPONENT_ROLES
    from components.images import TRACKING, Images, ImagesArgs, image_name
    from infra.render import run_program

    def program():
        Images("images", ImagesArgs(repo_root=REPO, registry="", tag="dev", tracking=True))
        return {}

    resources, _ = run_program({}, set(), "dev", program=program)
    builds = {r["name"].removeprefix("images-"): r["inputs"] for r in resources
              if r["type"] == "docker:index/image:Image"}
    assert set(builds) == {*COMPONENT_ROLES, TRACKING} == set(ROLES)
    declared = {}
    for role, inputs in builds.items():
        declared[role] = inputs["build"]["target"]
        assert inputs["build"]["dockerfile"] == str(REPO / "Dockerfile")
        assert inputs["build"]["context"] == str(REPO)
        assert inputs["imageName"] == image_name("", role, "dev") == f"elastic-ctr-{role}:dev"
    script = subprocess.run([str(SCRIPTS / "build-images.sh"), "--roles"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert sorted(script) == sorted(declared.values()) == sorted(declared)
    stages = re.findall(r"(?im)^FROM\s+\S+\s+AS\s+(\S+)\s*$", (REPO / "Dockerfile").read_text())
    assert set(declared.values()) <= set(stages), f"Dockerfile stages: {stages}"
    # the script builds --target <role> of the repository's Dockerfile (from a snapshot of the
    # repository root, the component's context) and tags it as the component names it
    text = (SCRIPTS / "build-images.sh").read_text()
    assert "CONTEXT=$REPO" in text and "DOCKERFILE=$CONTEXT/Dockerfile" in text
    assert '--target "$role" -t "$image" -f "$DOCKERFILE"' in text and "image=elastic-ctr-$role:$TAG" in text


@pytest.mark.parametrize("role", ROLES + EXTRA_TARGETS)
def test_image_exists_and_its_size_is_bounded(engine, images, role, record_property):
    ref = images.refs[role]
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", ref).stdout)
    record_property(f"{role}_image_bytes", size)
    built = images.seconds.get(role)
    report_size(f"{ref}: {size / 1e6:.0f} MB" + (f" (build-images.sh this session: {built:.1f} s)" if built else ""))
    assert 0 < size <= MAX_SIZE[role], f"{ref} is {size / 1e6:.0f} MB (bound {MAX_SIZE[role] / 1e6:.0f} MB)"


@pytest.mark.parametrize("role,args", RUNS, ids=[f"{r}:{' '.join(a)}" for r, a in RUNS])
def test_role_starts_read_only_as_user_10001(engine, images, role, args):
    image = images.refs[role]
    if args[0] == "python":
        code = args[2] + "; import os; print('uid', os.getuid(), 'gid', os.getgid())"
        proc = engine.docker(*POD_LIKE, "--entrypoint", "python", image, "-c", code, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "uid 10001 gid 10001" in proc.stdout
    else:
        proc = engine.docker(*POD_LIKE, image, *args, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "usage:" in proc.stdout.lower(), proc.stdout


@pytest.mark.parametrize("role", ROLES + EXTRA_TARGETS)
def test_image_runs_as_user_10001_by_default(engine, images, role):
    image = images.refs[role]
    assert engine.docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == "10001:10001"
    proc = engine.docker("run", "--rm", "--network", "host", "--read-only", "--entrypoint", "id", image, "-u")
    assert proc.stdout.strip() == "10001"
    entrypoint = engine.docker("image", "inspect", "--format", "{{json .Config.Entrypoint}}", image).stdout.strip()
    assert entrypoint == ('["mlflow"]' if role == "tracking" else '["elastic-ctr"]')


def test_engine_started_here_has_host_networking_only(engine):
    """engine.sh's own daemon runs with --bridge=none: no bridge network (nor docker0) to create."""
    if engine.origin == "existing":
        pytest.skip("the engine in use was not started by scripts/engine.sh")
    names = set(engine.docker("network", "ls", "--format", "{{.Name}}").stdout.split())
    assert names <= {"host", "none"}, names
