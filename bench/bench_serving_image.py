"""Serving images (``make bench-serving-image``): each image's size and its cold start, from
``docker run`` to ``/v2/health/live`` and to ``/v2/health/ready`` answering 200 (the
workers loaded the version's dense model and cube answered), its memory once ready and
its stop.

Setup: a synthetic version (``bench.served.served_version``: the trainer's export, the
default widths) rolled out to a local 2-shard cube; each image runs ``serve`` over it as a
pod does (``--network host``, read-only root, ``/tmp`` a tmpfs, user 10001, the topology
mounted), 2 workers, ``--starts`` times, the images' order alternating; a fresh container
every time (removed after its stop), so nothing is cached between starts but the engine's image layers
and the host's page cache. The engine: ``scripts/engine.sh start`` (``make images`` builds
the images).

``--image 'REF [ARG...]'`` (repeatable): an image and extra arguments of its ``serve``
(e.g. ``'elastic-ctr-serving-paddle:dev --dense-backend paddle'``). Prints one line per
start, a table, and per image ``serving_image image=<ref> size_mb=<x> live_s=<median>
ready_s=<median> memory_mib=<median>``.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.served import served_version  # noqa: E402
from runtime import proc, storage  # noqa: E402

DEFAULT_IMAGES = ["elastic-ctr-serving:dev", "elastic-ctr-serving-paddle:dev --dense-backend paddle"]


def engine_env() -> dict:
    """The environment with ``DOCKER_HOST`` of the engine ``scripts/engine.sh start`` makes
    available. Raises ``RuntimeError`` with its message when there is none."""
    r = subprocess.run([str(REPO / "scripts" / "engine.sh"), "start"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/engine.sh start exited {r.returncode}: {r.stderr.strip()[-500:]}")
    env = dict(os.environ)
    for line in r.stdout.splitlines():
        if m := re.match(r"export (DOCKER_HOST|DOCKER_API_VERSION)=(.*)$", line):
            env[m.group(1)] = m.group(2)
    return env


def docker(env: dict, *args: str, timeout: float = 120) -> str:
    """``docker ARGS`` -> stdout; ``RuntimeError`` naming the command when it fails."""
    r = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])}...: exit {r.returncode}: {(r.stdout + r.stderr)[-800:]}")
    return r.stdout


def _mib(text: str) -> float:
    """``docker stats``'s ``MemUsage`` (``123.4MiB / 23.4GiB``) -> MiB of its first figure."""
    m = re.match(r"\s*([\d.]+)\s*([KMG]i?B|B)", text)
    if not m:
        return float("nan")
    scale = {"B": 1 / 2**20, "KiB": 1 / 1024, "KB": 1 / 1024, "MiB": 1, "MB": 1, "GiB": 1024, "GB": 1024}
    return float(m.group(1)) * scale.get(m.group(2), float("nan"))


def cold_start(env: dict, image: str, extra: list[str], setup, timeout_s: float) -> dict:
    """One container of ``image`` serving ``setup``'s version: seconds from ``docker run``
    to live and to ready, MiB once ready, seconds ``docker stop`` took and the exit code."""
    port, grpc_port = proc.free_ports(2)
    url = f"http://127.0.0.1:{port}"
    name = f"bench-serving-image-{os.getpid()}-{port}"
    args = ["run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
            "--user", "10001:10001", "-v", f"{setup.cube.topology_path}:/topology.json:ro", image,
            "serve", "--topology", "/topology.json", "--model-root", setup.cube.root_url,
            "--transfer-url", setup.cube.transfer_url, "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port), "--workers", "2", "--work-dir", "/tmp/models", *extra]
    session = storage.session()
    t0 = time.monotonic()
    docker(env, *args)
    live = ready = None
    try:
        while time.monotonic() - t0 < timeout_s and ready is None:
            for path in ("/v2/health/live",) if live is None else ("/v2/health/ready",):
                try:
                    if session.get(url + path, timeout=1).status_code == 200:
                        if live is None:
                            live = time.monotonic() - t0
                        else:
                            ready = time.monotonic() - t0
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
            time.sleep(0.02)
        if ready is None:
            raise RuntimeError(f"{image}: not ready after {timeout_s:.0f} s: "
                               f"{docker(env, 'logs', '--tail', '20', name)[-1500:]}")
        mem = _mib(docker(env, "stats", "--no-stream", "--format", "{{.MemUsage}}", name))
    finally:
        t1 = time.monotonic()
        subprocess.run(["docker", "stop", "-t", "20", name], env=env, capture_output=True, timeout=60)
        stop_s = time.monotonic() - t1
        state = subprocess.run(["docker", "inspect", "--format", "{{.State.ExitCode}}", name], env=env,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        subprocess.run(["docker", "rm", "-f", name], env=env, capture_output=True, timeout=60)
    code = int(state) if state.lstrip("-").isdigit() else None
    return {"live_s": live, "ready_s": ready, "memory_mib": mem, "stop_s": stop_s, "code": code}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", action="append", default=[],
                    help=f"an image and extra serve arguments, one string (repeatable; default: {DEFAULT_IMAGES})")
    ap.add_argument("--starts", type=int, default=3, help="cold starts per image (default 3)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds a start may take to be ready")
    ap.add_argument("--exporter", default=str(REPO),
                    help="the checkout whose trainer export publishes the version (an image of another state of "
                    "the code reads the versions of that state's export; default: this one)")
    args = ap.parse_args()
    images = [s.split() for s in (args.image or DEFAULT_IMAGES)]
    env = engine_env()
    sizes = {img[0]: int(docker(env, "image", "inspect", "--format", "{{.Size}}", img[0])) for img in images}
    results: dict[str, list[dict]] = {" ".join(img): [] for img in images}
    with served_version("bench-serving-image-", 512, exporter=Path(args.exporter)) as setup:
        print(f"cube: 2 shards serving version {setup.vid}; {os.cpu_count()} CPUs", flush=True)
        for k in range(args.starts):
            order = images if k % 2 == 0 else images[::-1]
            for img in order:
                r = cold_start(env, img[0], img[1:], setup, args.timeout)
                results[" ".join(img)].append(r)
                print(f"  {' '.join(img):<56} start {k}: live {r['live_s']:.2f} s, ready {r['ready_s']:.2f} s, "
                      f"{r['memory_mib']:.0f} MiB, stopped in {r['stop_s']:.1f} s (exit code {r['code']})", flush=True)
    print("\n| image | size MB | live s (median) | ready s (median, min-max) | memory MiB once ready |")
    print("|---|---:|---:|---:|---:|")
    lines = []
    for label, rs in results.items():
        ref = label.split()[0]
        live = float(np.median([r["live_s"] for r in rs]))
        ready = [r["ready_s"] for r in rs]
        mem = float(np.median([r["memory_mib"] for r in rs]))
        print(f"| `{label}` | {sizes[ref] / 1e6:.0f} | {live:.2f} | {np.median(ready):.2f} ({min(ready):.2f}-"
              f"{max(ready):.2f}) | {mem:.0f} |")
        lines.append(f"serving_image image={ref} size_mb={sizes[ref] / 1e6:.0f} live_s={live:.2f} "
                     f"ready_s={np.median(ready):.2f} memory_mib={mem:.0f}")
    la = os.getloadavg()
    print(f"load average: {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
