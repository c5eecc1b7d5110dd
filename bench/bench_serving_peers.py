"""Serving against a peer (``make bench-serving-peers``): this project's ``elastic-ctr serve``
and a KServe 0.21 ``ModelServer`` over the same data plane, cube and version, load from
``wrk``.

Setup (``bench/bench_serving.py``'s, by import): generated test rows, a synthetic version
shaped like the trainer's export (``make_version``), a local cube of 2 shards
(``LocalCubeCluster``: file server, transfer, cube servers and agents as processes). Then:

- the floor: CPU per batch of a cube lookup then the model run on its embeddings, as a
  request runs them, with no server (``bench_serving.floor_figures``, ``make
  bench-serving``'s, in a spawned process);
- ``elastic-ctr serve`` (``--workers`` uvicorn workers, ``--threads`` each, HTTP only) and
  ``bench/kserve_peer.py`` in its own venv (``--kserve-python``, KServe needs protobuf 6):
  a ``ModelServer`` with as many uvicorn workers whose ``Model.predict`` calls this
  project's data plane (``runtime.serving.launcher.build_dataplane``); both import the
  ``runtime`` of the repository this file is in (``PYTHONPATH``), so a copy of this file in
  another worktree measures that worktree's serving;
- the same Open Inference Protocol v2 JSON bodies (``runtime.serving.client.encode_batches``)
  sent to both; the answers of the first ones compared (``wrk_load.compare_answers``) and
  the run stopped when they differ;
- per batch size, ``--rounds`` rounds of ``--duration`` s of ``wrk`` (1 thread,
  ``--connections`` keep-alive connections, closed loop, ``bench/wrk_post.lua``) against
  each server in turn, the order alternating; CPU per request is the server's process tree
  CPU time (``bench_serving.tree_cpu_s``: the master and its workers) over the round
  divided by the requests answered, the cube servers' alike;
- a pair of servers (ours and KServe) per dense backend (``--dense-backends``, default
  Paddle Inference and ONNX Runtime, both in one sitting; serve's and the peer's
  ``--dense-backend``), each pair compared with itself; the backend each side ran is read
  from the servers (ours: the model's ``platform``; KServe's workers: their ready markers);
- a round in which one worker of a server did less than ``LOPSIDED`` of the busiest one's
  CPU (every keep-alive connection of ``wrk`` landed on one worker: that server then
  answers at one worker's rate) is printed, left out and run again, at most
  ``--lopsided-retries`` times (a round still lopsided then is kept and counted).

KServe's workers also time their ``DataPlane.infer`` calls (thread CPU, ``bench/plane_cpu.py``):
the data plane's CPU per request as KServe calls it (its decoded inputs turned into arrays
and checked, the lookups, the model run). From it and the machine's CPU per request
(server, cube servers and ``wrk``, whose CPU is that of this process's waited children), a
line per batch size gives the requests/s ratio these figures predict when the machine's
CPU bounds both servers, beside the measured one, and the ratio a server costing only
KServe's data-plane calls would reach. At batch 1 both servers hand the data plane the
same Python lists (serving's codec reads documents up to ``SMALL_DOCUMENT`` bytes into
Python values), so that ratio is the ceiling of any server over this data plane on this
machine; at batch 256 serving's codec hands it typed arrays, and KServe's figure includes
turning its decoded lists into arrays.

Prints a table and, last, per dense backend ``serving_peers backend=<b> ours=<b>
kserve=<b> batch1_ratio=<ours/kserve> batch256_ratio=<ours/kserve> lopsided_rounds=<n>
batch256_rows_s=<x> batch256_cpu_ms=<y> batch256_floor_ms=<z>``: the backends each side ran,
the ratios of requests/s answered 200, the lopsided rounds kept, ours' rows/s and serving
CPU ms per request at batch 256, and the floor's CPU ms for a batch of 256 (lookups then
model run). Requests/s on a shared
machine move with its load: the ratios (servers measured in the same minutes) are the
figures to compare; the load average is printed with them.
"""
from __future__ import annotations

import argparse
import http.client
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.served import served_version, start_serving  # noqa: E402
from bench_serving import _proc_cpu_s, tree_cpu_s  # noqa: E402
from bench_serving import floor_figures as bench_floor_figures  # noqa: E402
from plane_cpu import machine_ratio, plane_ms, read_totals  # noqa: E402
from wrk_load import compare_answers, loads, run_wrk, write_bodies, wrk_path  # noqa: E402

from runtime import proc  # noqa: E402
from runtime.serving.client import encode_batches  # noqa: E402

INFER_PATH = "/v2/models/ctr/infer"
#: a round where a worker's CPU is below this share of the busiest worker's is lopsided
LOPSIDED = 0.1


def post(url: str, body: bytes | None, timeout_s: float = 30.0, path: str = INFER_PATH) -> tuple[int, bytes]:
    """One ``POST`` of ``body`` (JSON; None: a ``GET``) to ``url`` + ``path`` -> ``(status,
    body)``. Raises ``OSError`` when the server does not answer."""
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        if body is None:
            c.request("GET", path)
        else:
            c.request("POST", path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def children_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live child of ``pid`` (a server's worker processes), from
    ``/proc``."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out[int(d)] = tree_cpu_s(int(d))
    return out


def wait_ready(group: proc.ProcessGroup, role: proc.Role, url: str, timeout_s: float = 180.0,
               markers: tuple[Path, int] | None = None) -> None:
    """Waits for ``url``'s ``/v2/health/ready`` to answer 200 (and, with ``markers``
    ``(dir, count)``, for ``count`` ``ready-*`` files in ``dir``). Raises ``TimeoutError``
    with the role's log, ``proc.RoleFailed`` when a role died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        try:
            ok = post(url, None, 2.0, "/v2/health/ready")[0] == 200
        except OSError:  # not listening yet
            ok = False
        if ok and (markers is None or len(list(markers[0].glob("ready-*"))) >= markers[1]):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{role.name} not ready after {timeout_s:.0f} s:\n{proc.tail(role.log_path)}")


def start_servers(cube, tmp: Path, args, backend: str) -> dict[str, tuple[proc.Role, str]]:
    """Starts ``elastic-ctr serve`` (``ours``) and the KServe peer (``kserve``) over ``cube``,
    both on dense backend ``backend``; returns ``{name: (role, url)}`` once both answer
    ready with every worker loaded. Raises ``SystemExit`` when a side runs another backend
    than ``backend`` (``ran_backends``)."""
    env = {"PYTHONPATH": str(REPO)}
    ours, url, _ = start_serving(cube, tmp / f"serving-{backend}", args.workers, args.threads, grpc=False,
                                 cube_timeout_ms=args.cube_timeout_ms, timeout_s=180.0,
                                 extra=("--dense-backend", backend, *args.serve_args.split()), env=env, cwd=REPO,
                                 name=f"serving-{backend}")
    kport = proc.free_ports(1)[0]
    kdir = tmp / f"kserve-{backend}"
    peer = cube.group.start(f"kserve-{backend}", [
        args.kserve_python, str(REPO / "bench" / "kserve_peer.py"), "--topology", str(cube.topology_path),
        "--model-root", cube.root_url, "--transfer-url", cube.transfer_url, "--port", str(kport),
        "--workers", str(args.workers), "--threads", str(args.threads), "--work-dir", str(kdir),
        "--predict-on", args.kserve_predict, "--cube-timeout-ms", str(args.cube_timeout_ms),
        "--dense-backend", backend], env=env, cwd=REPO)
    servers = {"ours": (ours, url), "kserve": (peer, f"http://127.0.0.1:{kport}")}
    wait_ready(cube.group, peer, servers["kserve"][1], markers=(kdir, args.workers))
    ran = ran_backends(url, kdir)
    if set(ran.values()) != {backend}:
        raise SystemExit(f"dense backend {backend} asked for, the servers run {ran}")
    return servers


def ran_backends(url: str, kserve_dir: Path) -> dict[str, str]:
    """The dense backend each side runs: ours from its model metadata's ``platform``
    (``runtime.dense_backends.PLATFORMS``), KServe's from its workers' ready markers
    (``<version> <backend>``; several: joined by ``+``)."""
    import json

    from runtime import dense_backends

    platforms = {v: k for k, v in dense_backends.PLATFORMS.items()}
    status, body = post(url, None, 5.0, "/v2/models/ctr")
    ours = platforms.get(json.loads(body).get("platform"), "?") if status == 200 else "?"
    kserve = sorted({m.read_text().split()[-1] for m in kserve_dir.glob("ready-*")})
    return {"ours": ours, "kserve": "+".join(kserve) or "?"}


def stop(role: proc.Role, grace_s: float = 30.0) -> None:
    """SIGTERM to ``role``'s process group (its own session), SIGKILL after ``grace_s`` s
    (the process group's own 5 s are short for a graceful stop on a loaded machine)."""
    if role.proc.poll() is not None:
        return
    os.killpg(role.proc.pid, signal.SIGTERM)
    try:
        role.proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(role.proc.pid, signal.SIGKILL)
        role.proc.wait(10)


def same_answers(servers: dict, bodies: list[bytes], batch: int) -> int:
    """POSTs each body to both servers and compares the answers. Returns how many were
    compared; raises ``SystemExit`` naming the first difference or a non-200 answer."""
    for k, body in enumerate(bodies):
        docs = {}
        for name, (_, url) in servers.items():
            status, answer = post(url, body)
            if status != 200:
                raise SystemExit(f"batch {batch} body {k}: {name} answered {status}: {answer[:300]!r}")
            docs[name] = loads(answer, name)
        diffs = compare_answers(docs["ours"], docs["kserve"], ("ours", "kserve"))
        if diffs:
            raise SystemExit(f"batch {batch} body {k}: the servers' answers differ: " + "; ".join(diffs))
    return len(bodies)


def floor_figures(cube, root: Path, vid: int, data: str, batches: list[int], backend: str) -> dict:
    """The floor per batch size (``{batch: {"lookup_cpu_ms", "model_cpu_ms", "floor_cpu_ms"}}``:
    each alone, and a lookup then the model run as a request runs them), measured by ``make
    bench-serving``'s own ``bench_serving.floor_figures`` (a spawned process, no server),
    the model on ``backend``. Raises ``RuntimeError`` when that process dies."""
    res = bench_floor_figures(str(cube.topology_path), str(root), vid, data, batches, [], 1.0, backend)
    return {b: {"lookup_cpu_ms": res[b]["cube"], "model_cpu_ms": res[b]["model"], "floor_cpu_ms": res[b]["floor"]}
            for b in batches}


def _children_cpu_s() -> float:
    """CPU s of this process's children waited for so far (``wrk``'s, once each run ends)."""
    t = os.times()
    return t.children_user + t.children_system


def one_round(cube, tmp: Path, role: proc.Role, url: str, name: str, backend: str, bfile: Path, args) -> dict:
    """``--duration`` s of ``wrk`` against one server -> its figures: requests, CPU per
    request of the server, the cube servers and ``wrk`` (ms), KServe's data-plane CPU per
    request (``plane_ms``, None for ours), each worker's CPU seconds (``split``) and whether
    the round was lopsided (a worker below ``LOPSIDED`` of the busiest one's CPU)."""
    kdir = tmp / f"kserve-{backend}"
    cpu0, kids0 = tree_cpu_s(role.proc.pid), children_cpu_s(role.proc.pid)
    cube0 = sum(_proc_cpu_s(r.proc.pid) for r in cube.servers.values())
    plane0 = read_totals(kdir) if name == "kserve" else None
    wrk0 = _children_cpu_s()
    r = run_wrk(url, INFER_PATH, bfile, args.connections, args.duration, wrk=args.wrk)
    wrk_cpu = _children_cpu_s() - wrk0
    plane = plane_ms(plane0, read_totals(kdir)) if plane0 is not None else None
    cpu = tree_cpu_s(role.proc.pid) - cpu0
    kids = children_cpu_s(role.proc.pid)
    split = sorted((kids[k] - kids0.get(k, 0.0) for k in kids), reverse=True)[:args.workers]
    cube_cpu = sum(_proc_cpu_s(x.proc.pid) for x in cube.servers.values()) - cube0
    lopsided = len(split) > 1 and split[-1] < LOPSIDED * max(split[0], 1e-9)
    r.update(server=name, backend=backend, ok=max(0, r["requests"] - r["non_2xx"]), load=os.getloadavg()[0],
             cpu_ms=cpu * 1e3 / max(1, r["requests"]), cube_cpu_ms=cube_cpu * 1e3 / max(1, r["requests"]),
             wrk_cpu_ms=wrk_cpu * 1e3 / max(1, r["requests"]), plane_ms=plane, split=split, lopsided=lopsided)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of wrk per round and server (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per batch size, order alternating (default 2)")
    ap.add_argument("--rows", type=int, default=4096, help="distinct rows sent (default 4096)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of each server (default 2)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads (and predictors) per worker (default 1, as serve's)")
    ap.add_argument("--connections", type=int, default=4, help="wrk connections (default 4)")
    ap.add_argument("--batches", default="1,256", help="batch sizes (default 1,256)")
    ap.add_argument("--compare", type=int, default=8, help="bodies per batch size whose answers are compared (default 8)")
    ap.add_argument("--kserve-python", default=str(REPO / ".venv-kserve" / "bin" / "python"),
                    help="the KServe venv's interpreter (default .venv-kserve/bin/python; make bench-serving-peers "
                         "makes it)")
    ap.add_argument("--kserve-predict", choices=["sync", "threads"], default="sync",
                    help="the KServe model's predict: sync (on the event loop, KServe's way for a synchronous "
                         "model; default) or threads (a coroutine over --threads threads per worker)")
    ap.add_argument("--cube-timeout-ms", type=float, default=2000.0,
                    help="both servers' cube lookup timeout (serve --cube-timeout-ms; default 2000: a loaded "
                         "machine slows the figures down rather than failing requests)")
    ap.add_argument("--wrk", default="wrk", help="the wrk executable (default: wrk on PATH)")
    ap.add_argument("--dense-backends", default="paddle,onnxruntime",
                    help="dense backends, a pair of servers (ours, KServe) on each, all in one sitting (default "
                         "paddle,onnxruntime)")
    ap.add_argument("--lopsided-retries", type=int, default=3,
                    help="times a lopsided round (one worker idle) is run again (default 3)")
    ap.add_argument("--serve-args", default="",
                    help="more arguments for elastic-ctr serve (ours), e.g. '--threads 2' to measure "
                         "two inference threads per worker")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    wrk_path(args.wrk)  # fail now, not after the setup
    if not os.access(args.kserve_python, os.X_OK):
        raise SystemExit(f"--kserve-python: {args.kserve_python} is not an executable (make bench-serving-peers "
                         "creates .venv-kserve)")

    backends = args.dense_backends.split(",")
    load_before = os.getloadavg()
    results, floors, ran = [], {}, {}
    with served_version("bench-serving-peers-", args.rows) as setup:
        tmp, rows, root, vid, cube = setup.tmp, setup.rows, setup.root, setup.vid, setup.cube
        print(f"cube: 2 shards, version {vid}; serving code from {REPO}"
              + (f"; serve {args.serve_args}" if args.serve_args else ""), flush=True)
        for backend in backends:
            floors[backend] = floor_figures(cube, root, vid, str(setup.data), batches, backend)
            for b, f in floors[backend].items():
                print(f"floor {backend:<11} batch {b:>4}: a lookup then the model run {f['floor_cpu_ms']:.3f} ms CPU "
                      f"(alone, each in a loop of its own: lookups {f['lookup_cpu_ms']:.3f} ms, model run "
                      f"{f['model_cpu_ms']:.3f} ms)", flush=True)
        pairs = {backend: start_servers(cube, tmp, args, backend) for backend in backends}
        for backend, servers in pairs.items():
            ran[backend] = ran_backends(servers["ours"][1], tmp / f"kserve-{backend}")
        said = ", ".join(f"{b}: ours {r['ours']}, KServe {r['kserve']}" for b, r in ran.items())
        print(f"servers: ours and KServe per dense backend ({said}), "
              f"{args.workers} workers x {args.threads} threads each (KServe's predict: {args.kserve_predict}); "
              f"{os.cpu_count()} CPUs", flush=True)
        for b in batches:
            bodies = [body for body, _, _ in encode_batches(rows, b)]
            bfile = write_bodies(bodies, tmp / f"bodies-{b}.txt")
            for backend, servers in pairs.items():
                n = same_answers(servers, bodies[:args.compare], b)
                print(f"batch {b}, {backend}: {n} answers compared, equal", flush=True)
                for name, (_, url) in servers.items():  # warm-up: both workers, every code path
                    run_wrk(url, INFER_PATH, bfile, args.connections, 2.0, wrk=args.wrk)
            for rnd in range(args.rounds):
                for backend in (backends if rnd % 2 == 0 else backends[::-1]):
                    servers = pairs[backend]
                    for name in (["ours", "kserve"] if rnd % 2 == 0 else ["kserve", "ours"]):
                        for attempt in range(args.lopsided_retries + 1):
                            r = one_round(cube, tmp, servers[name][0], servers[name][1], name, backend, bfile, args)
                            r.update(batch=b, round=rnd, attempt=attempt)
                            last = attempt == args.lopsided_retries
                            r["kept"] = not r["lopsided"] or last
                            results.append(r)
                            print(f"  batch {b:>4} round {rnd} {backend:<11} {name:<6}: {r['ok'] / r['duration_s']:8.1f} "
                                  f"requests/s ({r['ok'] * b / r['duration_s']:9.0f} rows/s)  p50 {r['p50_ms']:7.2f} ms  "
                                  f"p99 {r['p99_ms']:7.2f} ms  non-2xx {r['non_2xx']}  socket errors "
                                  f"{r['socket_errors']}  CPU/request: server {r['cpu_ms']:.2f} ms, cube "
                                  f"{r['cube_cpu_ms']:.2f} ms, wrk {r['wrk_cpu_ms']:.2f} ms"
                                  + (f", data plane {r['plane_ms']:.2f} ms" if r["plane_ms"] is not None else "")
                                  + f"  workers' CPU s {'/'.join(f'{x:.1f}' for x in r['split'])}  "
                                  f"load {r['load']:.1f}"
                                  + ("  LOPSIDED: " + ("kept (retries spent)" if last else "run again")
                                     if r["lopsided"] else ""), flush=True)
                            if r["kept"]:
                                break

        for servers in pairs.values():
            for name, (role, _) in servers.items():
                stop(role)
        print("servers stopped by SIGTERM: " + ", ".join(f"{backend} {name} exit {role.proc.returncode}"
                                                         for backend, servers in pairs.items()
                                                         for name, (role, _) in servers.items()), flush=True)

    def agg(name: str, b: int, backend: str) -> dict:
        rs = [r for r in results if r["server"] == name and r["batch"] == b and r["backend"] == backend and r["kept"]]
        dur = sum(r["duration_s"] for r in rs)
        req = sum(r["requests"] for r in rs)
        planes = [r["plane_ms"] for r in rs if r["plane_ms"] is not None]  # KServe's rounds only
        return {"rps": sum(r["ok"] for r in rs) / dur, "failed": sum(r["non_2xx"] + r["socket_errors"] for r in rs),
                "cpu_ms": sum(r["cpu_ms"] * r["requests"] for r in rs) / max(1, req),
                "cube_cpu_ms": sum(r["cube_cpu_ms"] * r["requests"] for r in rs) / max(1, req),
                "wrk_cpu_ms": sum(r["wrk_cpu_ms"] * r["requests"] for r in rs) / max(1, req),
                "plane_ms": statistics.fmean(planes) if planes else None, "lopsided": sum(r["lopsided"] for r in rs),
                "p50_ms": max(r["p50_ms"] for r in rs), "p99_ms": max(r["p99_ms"] for r in rs)}

    print("\n| backend | batch | server | requests/s | rows/s | p50 ms | p99 ms | failed | server CPU ms/request | "
          "cube CPU ms/request | floor CPU ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    figs = {}
    for backend in backends:
        for b in batches:
            for name in ("ours", "kserve"):
                a = figs[name, b, backend] = agg(name, b, backend)
                print(f"| {backend} | {b} | {name} | {a['rps']:.0f} | {a['rps'] * b:.0f} | {a['p50_ms']:.2f} | "
                      f"{a['p99_ms']:.2f} | {a['failed']} | {a['cpu_ms']:.2f} | {a['cube_cpu_ms']:.2f} | "
                      f"{floors[backend][b]['floor_cpu_ms']:.2f} |")
    la = os.getloadavg()
    redone = sum(1 for r in results if not r["kept"])
    print(f"(p50/p99: the worst round; {args.rounds} rounds of {args.duration:g} s per server, backend and batch, "
          f"{args.connections} connections, wrk 1 thread; {redone} lopsided round(s) run again)")
    print(f"load average: {load_before[0]:.1f} before, {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} after, on "
          f"{os.cpu_count()} CPUs (other work on the machine lowers requests/s; the ratios compare servers "
          "measured in the same minutes)")

    def ratio(b: int, backend: str) -> float:
        if ("ours", b, backend) not in figs:
            return float("nan")
        return figs["ours", b, backend]["rps"] / max(figs["kserve", b, backend]["rps"], 1e-9)

    for backend in backends:
        print(f"{backend}: server CPU per request, kserve/ours: " + ", ".join(
            f"batch {b} {figs['kserve', b, backend]['cpu_ms'] / max(figs['ours', b, backend]['cpu_ms'], 1e-9):.2f}"
            for b in batches) + " (moves less with the machine's load than requests/s do)")
        for b in batches:  # what KServe's data-plane calls cost, and a server costing only those (plane_cpu.py)
            o, k = figs["ours", b, backend], figs["kserve", b, backend]
            if k["plane_ms"] is None:
                continue
            peer = (k["cpu_ms"], k["cube_cpu_ms"], k["wrk_cpu_ms"])
            est = machine_ratio(peer, (o["cpu_ms"], o["cube_cpu_ms"], o["wrk_cpu_ms"]))
            top = machine_ratio(peer, (k["plane_ms"], o["cube_cpu_ms"], o["wrk_cpu_ms"]))
            print(f"{backend} batch {b}: KServe's DataPlane.infer calls cost {k['plane_ms']:.2f} ms of its "
                  f"{k['cpu_ms']:.2f} ms of CPU per request. Machine CPU per request (server + cube + wrk): ours "
                  f"{o['cpu_ms']:.2f} + {o['cube_cpu_ms']:.2f} + {o['wrk_cpu_ms']:.2f}, KServe {k['cpu_ms']:.2f} + "
                  f"{k['cube_cpu_ms']:.2f} + {k['wrk_cpu_ms']:.2f} ms: ours {est:.2f}x KServe by these (measured "
                  f"{ratio(b, backend):.2f}x); a server costing only KServe's data-plane calls {top:.2f}x")
    big = 256 if 256 in batches else max(batches)
    for backend in backends:
        kept_lopsided = sum(figs[name, b, backend]["lopsided"] for name in ("ours", "kserve") for b in batches)
        print(f"serving_peers backend={backend} ours={ran[backend]['ours']} kserve={ran[backend]['kserve']} "
              f"batch1_ratio={ratio(1, backend):.2f} batch256_ratio={ratio(256, backend):.2f} "
              f"lopsided_rounds={kept_lopsided} batch256_rows_s={figs['ours', big, backend]['rps'] * big:.0f} "
              f"batch256_cpu_ms={figs['ours', big, backend]['cpu_ms']:.2f} "
              f"batch256_floor_ms={floors[backend][big]['floor_cpu_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
