"""Fixtures for the container tests: a Docker engine (``scripts/engine.sh start``) and the
role images, built once per session by ``scripts/build-images.sh`` (what ``make images``
runs, so a session after ``make images`` reuses its images and cache).

Where no engine answers and none can be started (``engine.sh`` exits 3: not root, or not
Debian) every test that needs one skips, naming why; with ``CI=true`` they fail instead.
An engine this session started is stopped at its end; one that was already running is left
alone. The images stay in the engine (``.cache/containers``), so the next session is warm.
``ELASTIC_CTR_NO_BUILD=1`` uses the images already in the engine without building (printed
in the summary: they may be older than the tree).
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
#: the Pulumi Images component's roles (tests check that this, the script and the component agree)
ROLES = ("trainer", "cube", "serving", "tracking")
#: Dockerfile targets built besides the roles' (``serving-paddle``: serving with Paddle Inference,
#: the component's serving image for ``denseBackend: paddle``)
EXTRA_TARGETS = ("serving-paddle",)
#: seconds allowed for engine.sh start (it may install docker.io) and for the image builds
ENGINE_TIMEOUT = 900
BUILD_TIMEOUT = int(os.environ.get("ELASTIC_CTR_BUILD_TIMEOUT", "3600"))

_SIZES: list[str] = []   # lines for the terminal summary


def cache_dir() -> Path:
    """The scripts' cache directory (``ELASTIC_CTR_CACHE``, default ``<repo>/.cache/containers``)."""
    return Path(os.environ.get("ELASTIC_CTR_CACHE") or REPO / ".cache" / "containers")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def unavailable(reason: str) -> None:
    """Skips (fails with ``CI=true``) the tests that need an engine."""
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason} (CI=true: the container tests must run here)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Engine:
    """A Docker engine that answers: ``env`` has its ``DOCKER_HOST``; ``origin`` is
    ``started`` (this session started it), ``running`` (ours, started earlier) or
    ``existing`` (a daemon engine.sh did not start)."""

    env: dict[str, str]
    origin: str

    def docker(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"docker {' '.join(args)} exited {proc.returncode}:\n{_tail(proc.stdout + proc.stderr)}",
                        pytrace=False)
        return proc


@dataclass
class Images:
    """The role images: ``refs[role]`` = ``elastic-ctr-<role>:<tag>``; ``sizes`` in bytes and
    ``seconds`` as build-images.sh reported them (this session's build, often all cache hits)."""

    tag: str
    refs: dict[str, str]
    sizes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="session")
def engine():
    env = {k: v for k, v in os.environ.items()}
    env["ELASTIC_CTR_CACHE"] = str(cache_dir())
    try:
        proc = subprocess.run([str(SCRIPTS / "engine.sh"), "start"], env=env, capture_output=True, text=True,
                              timeout=ENGINE_TIMEOUT)
    except FileNotFoundError as e:
        unavailable(f"cannot run scripts/engine.sh: {e}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/engine.sh start did not finish in {ENGINE_TIMEOUT}s", pytrace=False)
    if proc.returncode == 3:
        msg = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "exit 3"
        unavailable(f"no Docker engine: {msg.removeprefix('engine.sh: error: ')}")
    if proc.returncode != 0:
        pytest.fail(f"scripts/engine.sh start exited {proc.returncode}:\n{_tail(proc.stderr)}", pytrace=False)
    origin = "existing"
    for line in proc.stdout.splitlines():
        if m := re.match(r"# engine=(\w+)", line):
            origin = m.group(1)
        elif m := re.match(r"export (DOCKER_HOST|DOCKER_API_VERSION)=(.*)$", line):
            env[m.group(1)] = m.group(2)
    yield Engine(env=env, origin=origin)
    if origin == "started":
        subprocess.run([str(SCRIPTS / "engine.sh"), "stop"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def images(engine):
    tag = os.environ.get("IMAGE_TAG", "dev")
    if os.environ.get("ELASTIC_CTR_NO_BUILD", "").strip() == "1":
        # the images already in the engine, as they are (a re-run of one test after a full
        # build while the tree moves on); said in the summary, since they may be older than the tree
        refs = {role: f"elastic-ctr-{role}:{tag}" for role in ROLES + EXTRA_TARGETS}
        missing = [r for r in refs.values() if engine.docker("image", "inspect", r, check=False).returncode != 0]
        if missing:
            pytest.fail(f"ELASTIC_CTR_NO_BUILD=1 but {missing} are not in the engine", pytrace=False)
        report_size(f"ELASTIC_CTR_NO_BUILD=1: images NOT rebuilt from this tree: {sorted(refs.values())}")
        return Images(tag=tag, refs=refs)
    env = dict(engine.env, IMAGE_TAG=tag)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "build-images-pytest.log"
    with open(log, "w") as err:
        try:
            proc = subprocess.run([str(SCRIPTS / "build-images.sh"), *ROLES, *EXTRA_TARGETS], env=env, stdout=subprocess.PIPE,
                                  stderr=err, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"scripts/build-images.sh did not finish in {BUILD_TIMEOUT}s (log: {log})", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-images.sh exited {proc.returncode} (log: {log}):\n{_tail(log.read_text())}",
                    pytrace=False)
    built = Images(tag=tag, refs={role: f"elastic-ctr-{role}:{tag}" for role in ROLES + EXTRA_TARGETS})
    for line in proc.stdout.splitlines():     # "<image> <size bytes> <seconds>"
        ref, size, secs = line.split()
        role = ref.split(":")[0].removeprefix("elastic-ctr-")
        built.sizes[role], built.seconds[role] = int(size), float(secs)
    return built


def report_size(line: str) -> None:
    _SIZES.append(line)


def pytest_terminal_summary(terminalreporter):
    if _SIZES:
        terminalreporter.section("container images")
        for line in _SIZES:
            terminalreporter.write_line(line)
