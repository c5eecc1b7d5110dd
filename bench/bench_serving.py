"""Serving benchmark (``make bench-serving``): requests/s and p50/p99 latency of
``POST /v2/models/ctr/infer`` at batch 1 and 256, with 1 and 4 concurrent clients,
against a local cube of 2 shards (file server + transfer + cube servers/agents as
processes, ``runtime.local.cube.LocalCubeCluster``) and ``elastic-ctr serve``.

The version served is synthetic but shaped like the trainer's export: a dense model with
the trainer's default widths (embedding 9, layers 128-64-32) and an embedding for every
feasign of the rows sent (1 in 7 left out: looked up as a miss). Each client is its own
process with one keep-alive connection (``http.client``) sending pre-encoded requests
back to back (closed loop), so client CPU stays small next to the server's.

Three transports in one run: JSON over HTTP, HTTP with binary tensors (Triton's binary
tensor data extension) and gRPC (``ModelInfer`` with raw contents); serving CPU per request
beside each row, next to its floor: before the load, a process of its own (no server)
measures for the same batches a cube lookup (the client's CPU, serving's share of it) then
the model run on its embeddings, one after the other as a request runs them: the CPU a
request cannot go below (each alone is printed beside it; ``measure_floor``). The same
process also runs whole requests in process (codec, data plane, model and
cube, without the HTTP or gRPC server), which separates the codec's cost from the
server's. One server per dense backend (``--dense-backends``, default Paddle Inference and ONNX
Runtime), measured side by side in one sitting (each cell on each server in turn, who goes
first rotating); the floor and the in-process requests are measured per backend. Prints one
table, the backends compared (CPU per request, p99 and requests/s of each over the first's,
at 4 clients), and a final line per server ``serving backend=<b> batch1_cpu_ms=<x>
batch256_cpu_ms=<y> ...`` (serving CPU per JSON request at 4 clients; the binary and gRPC
ones named; p50 at 1 client, p99 and requests/s at 4). ``--floor-only`` measures the floor
and the in-process requests alone.
Targets (2 cores): batch-1 p50 <= 3 ms; >= 600 requests/s at batch 1 with 4 clients.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime import dense_backends, storage  # noqa: E402
from runtime.serving.client import encode_batches, load_rows  # noqa: E402
from bench.served import served_version, start_serving  # noqa: E402

def _closed_loop(send, duration_s: float) -> tuple[list[float], int]:
    """Calls ``send(i)`` (True: answered 200) back to back for ``duration_s`` seconds:
    the latencies (s) and the count of failed requests."""
    lat, failed, i = [], 0, 0
    end = time.perf_counter() + duration_s
    while (t0 := time.perf_counter()) < end:
        if not send(i):
            failed += 1
        lat.append(time.perf_counter() - t0)
        i += 1
    return lat, failed


def _http_client(url: str, bodies: list, duration_s: float, q) -> None:
    """Closed loop over pre-encoded HTTP bodies: ``(body, headers)`` pairs."""
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)

    def send(i: int) -> bool:
        body, headers = bodies[i % len(bodies)]
        c.request("POST", "/v2/models/ctr/infer", body, headers)
        r = c.getresponse()
        r.read()
        return r.status == 200

    out = _closed_loop(send, duration_s)
    c.close()
    q.put(out)


def _grpc_client(target: str, requests: list, duration_s: float, q) -> None:
    """Closed loop over pre-built ``ModelInferRequest`` bytes (gRPC is imported here, in
    the forked client, never in the parent)."""
    import grpc

    from runtime.serving.proto import open_inference_pb2 as pb
    from runtime.serving.proto import open_inference_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20),
                                                     ("grpc.max_send_message_length", 64 << 20)])
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    msgs = [pb.ModelInferRequest.FromString(r) for r in requests]

    def send(i: int) -> bool:
        try:
            stub.ModelInfer(msgs[i % len(msgs)], timeout=30)
            return True
        except grpc.RpcError:
            return False

    out = _closed_loop(send, duration_s)
    channel.close()
    q.put(out)


def encode_binary(rows, batch: int) -> list[tuple[bytes, dict]]:
    """HTTP requests with binary tensors in and out (Triton's binary tensor data extension)."""
    out = []
    n = len(rows.labels)
    for start in range(0, n, batch):
        dense = np.nan_to_num(rows.dense[start:start + batch]).astype("<f4")  # 0 = missing in binary data
        fs = rows.feasigns[start:start + batch].astype("<u8")
        head = json.dumps({"inputs": [
            {"name": "dense_features", "datatype": "FP32", "shape": list(dense.shape),
             "parameters": {"binary_data_size": dense.nbytes}},
            {"name": "feasigns", "datatype": "UINT64", "shape": list(fs.shape),
             "parameters": {"binary_data_size": fs.nbytes}}],
            "outputs": [{"name": "probability", "parameters": {"binary_data": True}}]}).encode()
        out.append((head + dense.tobytes() + fs.tobytes(),
                    {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}))
    return out


def encode_grpc(rows, batch: int) -> list[bytes]:
    """Serialized ``ModelInferRequest``s with raw contents (as tritonclient.grpc sends)."""
    from runtime.serving.proto import open_inference_pb2 as pb

    out = []
    n = len(rows.labels)
    for start in range(0, n, batch):
        dense = np.nan_to_num(rows.dense[start:start + batch]).astype("<f4")
        fs = rows.feasigns[start:start + batch].astype("<u8")
        req = pb.ModelInferRequest(model_name="ctr")
        req.inputs.add(name="dense_features", datatype="FP32", shape=list(dense.shape))
        req.inputs.add(name="feasigns", datatype="UINT64", shape=list(fs.shape))
        req.raw_input_contents.extend([dense.tobytes(), fs.tobytes()])
        out.append(req.SerializeToString())
    return out


class _Ctx:
    """The ``grpc.ServicerContext`` of an in-process call (only ``abort`` is used)."""

    def abort(self, code, message):
        raise RuntimeError(f"{code}: {message}")


def _cpu_ms_per_call(fn, items: list, min_s: float) -> float:
    """CPU ms (this process, every thread: ``time.process_time``) per ``fn(item)``: passes
    over ``items`` until ``min_s`` s of CPU time (at least 3), the median pass's mean (a
    pass slowed down by other work on the machine does not move it)."""
    for it in items[:3]:
        fn(it)  # warm-up
    passes, start = [], time.process_time()
    while len(passes) < 3 or time.process_time() - start < min_s:
        t0 = time.process_time()
        for it in items:
            fn(it)
        passes.append((time.process_time() - t0) * 1e3 / len(items))
    return float(np.median(passes))


def measure_floor(topology: str, root: str, vid: int, data: str, batches: list[int], transports: list[str],
                  min_s: float, q, backend: str = "onnxruntime") -> None:
    """Runs in its own (spawned) process, no server: for each batch size, the CPU per
    request of (a) the model run alone (``DenseModel.predict`` on normalized dense features
    and the batch's embeddings), (b) the cube lookups alone (``CubeClient.seek`` of the
    batch's keys, pinned to ``vid``; the client's CPU, which is serving's share of a lookup),
    (c) the floor: a lookup then a model run on the embeddings it returned, one after the
    other on one thread as a request runs them, (d) the whole request in process per
    transport (codec + data plane + model + cube, no HTTP or gRPC server: the REST app
    called as WSGI, the gRPC servicer called with the parsed message; the model on ``backend``,
    ``runtime.dense_backends``); beside (b), the same
    lookups by the client's Python path (``CubeClient(native=False)``, ``cube_python``),
    its peer. (a) and (b) each run in a loop of their own, which keeps their own data and
    code in the CPU's caches, and never waits: their sum (``parts``) can be well below what
    a request pays for the two. A request waits for the cube's replies, and other work
    runs on its core meanwhile, which costs the model run after it its warm caches. So
    (c) is the floor. Puts ``{batch: {"model": ms, "cube":
    ms, "cube_python": ms, "floor": ms, "parts": ms, <transport>: ms}}`` on ``q``."""
    import io

    from werkzeug.test import EnvironBuilder

    from runtime.cube.client import CubeClient
    from runtime.formats import features
    from runtime.serving.grpc_server import InferenceServicer
    from runtime.serving.launcher import build_dataplane
    from runtime.serving.model import DenseModel
    from runtime.serving.proto import open_inference_pb2 as pb
    from runtime.serving.rest import create_app

    rows = load_rows([data], "criteo")
    dense_model = DenseModel(vid, Path(root) / "versions" / str(vid) / "dense", pool_size=1, dense_backend=backend)
    cube = CubeClient.from_topology(topology, timeout_ms=2000, retries=2)
    cube_python = CubeClient.from_topology(topology, timeout_ms=2000, retries=2, native=False)  # the peer
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as work:
        plane = build_dataplane(topology, root, None, work, threads=1, wait_s=60, cube_timeout_ms=2000,
                                dense_backend=backend)
        app, servicer = create_app(plane), InferenceServicer(plane)
        n, out = len(rows.labels), {}
        for b in batches:
            starts = list(range(0, n - b + 1, b))[:64]
            keys = [np.ascontiguousarray(rows.feasigns[s:s + b].T).ravel() for s in starts]
            runs = []
            for s, k in zip(starts, keys):
                res = cube.seek(k, version=vid)
                vals = np.ascontiguousarray(res.values, dtype=np.float32)
                vals[~res.found] = 0.0
                dn = features.normalize_dense(rows.dense[s:s + b], dense_model.meta.normalization.clip_max)
                runs.append((dn, vals))
            r = {"model": _cpu_ms_per_call(lambda x: dense_model.predict(*x), runs, min_s),
                 "cube": _cpu_ms_per_call(lambda k: cube.seek(k, version=vid), keys, min_s),
                 "cube_python": _cpu_ms_per_call(lambda k: cube_python.seek(k, version=vid), keys, min_s),
                 # a lookup then a model run on its embeddings, as a request runs them (CtrModel._predict)
                 "floor": _cpu_ms_per_call(lambda x: dense_model.predict(x[0], cube.seek(x[1], version=vid).values),
                                           [(dn, k) for (dn, _), k in zip(runs, keys)], min_s)}
            r["parts"] = r["model"] + r["cube"]
            for t in transports:
                if t == "grpc":
                    msgs = encode_grpc(rows, b)[:len(starts)]
                    r[t] = _cpu_ms_per_call(lambda m: servicer.ModelInfer(pb.ModelInferRequest.FromString(m),
                                                                          _Ctx()).SerializeToString(), msgs, min_s)
                    continue
                bodies = ([(body, {"Content-Type": "application/json"}) for body, _, _ in encode_batches(rows, b)]
                          if t == "json" else encode_binary(rows, b))[:len(starts)]
                envs = [(EnvironBuilder(path="/v2/models/ctr/infer", method="POST", headers=h,
                                        content_length=len(body)).get_environ(), body) for body, h in bodies]

                def call(item):
                    env, body = item
                    env = dict(env, **{"wsgi.input": io.BytesIO(body)})
                    status = []
                    data = app(env, lambda st, hs: status.append(st))
                    if not status[0].startswith("200"):
                        raise RuntimeError(f"in-process {t} request: {status[0]} {b''.join(data)[:300]!r}")

                r[t] = _cpu_ms_per_call(call, envs, min_s)
            out[b] = r
    cube.close()
    cube_python.close()
    q.put(out)


def floor_figures(topology: str, root: str, vid: int, data: str, batches: list[int], transports: list[str],
                  min_s: float, backend: str = "onnxruntime") -> dict:
    """``measure_floor`` in a fresh (spawned) process: Paddle, ONNX Runtime and gRPC never
    enter the benchmark's own process, which forks the clients."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=measure_floor, args=(topology, root, vid, data, batches, transports, min_s, q, backend))
    p.start()
    try:
        while True:
            try:
                return q.get(timeout=1)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"the floor measurement exited with code {p.exitcode}") from None
    finally:
        p.join(30)


def _proc_cpu_s(pid: int) -> float:
    """user+system CPU seconds of one process (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (serving's workers)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += _proc_cpu_s(p)
        todo += kids.get(p, [])
    return total


def load(target: str, payloads: list, clients: int, duration_s: float, transport: str = "http") -> dict:
    """``clients`` closed-loop client processes for ``duration_s`` s -> figures."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    fn = _grpc_client if transport == "grpc" else _http_client
    ps = [ctx.Process(target=fn, args=(target, payloads[k::clients] or payloads, duration_s, q)) for k in range(clients)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    res = [q.get(timeout=duration_s + 60) for _ in ps]
    for p in ps:
        p.join()
    wall = time.perf_counter() - t0
    lat = np.concatenate([np.array(r[0]) for r in res]) * 1e3
    n = lat.size
    return {"requests": n, "failed": sum(r[1] for r in res), "rps": n / duration_s,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)), "wall_s": wall}


def _aggregate(rounds: list[dict], duration_s: float) -> list[dict]:
    """One figure per server and cell over its rounds: requests/s and CPU per request over
    them all (total CPU / total requests), p50 and p99 of the worst round, failures summed."""
    cells: dict[tuple, list[dict]] = {}
    for r in rounds:
        cells.setdefault((r["server"], r["transport"], r["batch"], r["clients"]), []).append(r)
    out = []
    for (server, transport, batch, clients), rs in cells.items():
        n = sum(r["requests"] for r in rs)
        out.append({"server": server, "transport": transport, "batch": batch, "clients": clients,
                    "rounds": len(rs), "requests": n, "rps": n / (duration_s * len(rs)),
                    "p50_ms": max(r["p50_ms"] for r in rs), "p99_ms": max(r["p99_ms"] for r in rs),
                    "failed": sum(r["failed"] for r in rs), "floor_ms": rs[0]["floor_ms"],
                    "serving_cpu_ms": sum(r["serving_cpu_s"] for r in rs) * 1e3 / max(1, n),
                    "cube_cpu_ms": sum(r["cube_cpu_s"] for r in rs) * 1e3 / max(1, n)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measurements per cell and server, the servers' order rotating (default 1); the table "
                         "gives CPU per request over them all, p50/p99 of the worst")
    ap.add_argument("--rows", type=int, default=4096, help="distinct rows sent (default 4096)")
    ap.add_argument("--workers", type=int, default=2, help="serving worker processes (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="serving threads per worker (default 1, as serve's)")
    ap.add_argument("--clients", default="1,4", help="concurrent clients to try (default 1,4)")
    ap.add_argument("--batches", default="1,256", help="batch sizes to try (default 1,256)")
    ap.add_argument("--transports", default="json,binary,grpc",
                    help="transports to measure: json, binary (HTTP binary tensors), grpc (default: all three)")
    ap.add_argument("--floor-s", type=float, default=1.0,
                    help="CPU seconds per floor / in-process measurement (default 1)")
    ap.add_argument("--overload-connections", type=int, default=64,
                    help="connections of the overload row (JSON, batch 256; bench/overload.py); 0: no such row")
    ap.add_argument("--slow-connections", type=int, default=64,
                    help="slow connections of the slow-clients row (tests/slow_clients.py; bench/overload.py); 0: no "
                         "such row")
    ap.add_argument("--floor-only", action="store_true",
                    help="measure the floor and the in-process requests only (no server, no load)")
    ap.add_argument("--dense-backends", default="paddle,onnxruntime",
                    help="dense backends to serve with (serve's --dense-backend), one server each, measured side by "
                         "side in one sitting (default: paddle,onnxruntime)")
    ap.add_argument("--serve-args", action="append", default=[],
                    help="more arguments for elastic-ctr serve, e.g. '--threads 2'; given several times, one server "
                         "per value, measured side by side (each cell on each server in turn, who goes first "
                         "rotating), with a table comparing them")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    transports = args.transports.split(",")
    backends = [dense_backends.check(b) for b in args.dense_backends.split(",")]

    t_roll = time.monotonic()
    with served_version("bench-serving-", args.rows) as setup:
        tmp, rows, root, vid, cube = setup.tmp, setup.rows, setup.root, setup.vid, setup.cube
        print(f"cube: 2 shards, version {vid} generated and rolled out in {time.monotonic() - t_roll:.1f} s",
              flush=True)
        print("floor (no server; CPU ms per request): a cube lookup (the client's share) then the model run, one "
              "after the other as a request runs them; beside it each alone, in a loop of its own (each loop "
              "keeps its own data in the CPU's caches and never waits for cube); in process = the whole "
              "request without the HTTP/gRPC server", flush=True)
        floors = {}  # dense backend -> batch -> figures
        for backend in backends:
            floors[backend] = floor = floor_figures(str(cube.topology_path), str(root), vid, str(setup.data), batches,
                                                    transports, args.floor_s, backend)
            for b, f in floor.items():
                print(f"  {backend:<11} batch {b:>4}: floor {f['floor']:.3f} ms (alone: model {f['model']:.3f} + cube "
                      f"{f['cube']:.3f} = {f['parts']:.3f}); in process: "
                      + ", ".join(f"{t} {f[t]:.3f} ms ({f[t] / f['floor']:.2f}x floor)" for t in transports), flush=True)
        for b, f in floors[backends[0]].items():
            print(f"  batch {b:>4}: cube client CPU ms per lookup: C path {f['cube']:.3f}, Python path "
                  f"{f['cube_python']:.3f} ({f['cube_python'] / f['cube']:.2f}x)", flush=True)
        if args.floor_only:
            return 0
        variants = args.serve_args or [""]
        servers = {}  # label -> (role, url, grpc target)
        backend_of = {}  # label -> dense backend
        k = 0
        for backend in backends:
            for extra in variants:
                label = f"{backend} {extra.strip()}".strip()
                servers[label] = start_serving(cube, tmp / f"serving-{k}", args.workers, args.threads,
                                               extra=("--dense-backend", backend, *extra.split()), name=f"serving-{k}")
                backend_of[label] = backend
                k += 1
        print(f"serving: {args.workers} worker(s) x {args.threads} threads; "
              + (f"servers side by side: {', '.join(servers)}; " if len(servers) > 1 else "")
              + f"{os.cpu_count()} CPUs on this machine", flush=True)
        rounds: list[dict] = []  # one per round, server and cell
        turn = 0
        for transport in transports:
            for b in batches:
                if transport == "json":
                    payloads = [(body, {"Content-Type": "application/json"}) for body, _, _ in encode_batches(rows, b)]
                elif transport == "binary":
                    payloads = encode_binary(rows, b)
                else:
                    payloads = encode_grpc(rows, b)
                kind = "grpc" if transport == "grpc" else "http"
                for sv, url, grpc_target in servers.values():  # warm-up
                    load({"json": url, "binary": url, "grpc": grpc_target}[transport], payloads[:50], 1, 1.0, kind)
                for c in [int(x) for x in args.clients.split(",")]:
                    for rnd in range(args.rounds):
                        order = list(servers)
                        turn += 1
                        order = order[turn % len(order):] + order[:turn % len(order)]  # who goes first rotates
                        for label in order:
                            sv, url, grpc_target = servers[label]
                            target = {"json": url, "binary": url, "grpc": grpc_target}[transport]
                            cpu0 = tree_cpu_s(sv.proc.pid)
                            cube0 = sum(_proc_cpu_s(r.proc.pid) for r in cube.servers.values())
                            r = load(target, payloads, c, args.duration, kind)
                            r.update(transport=transport, batch=b, clients=c, server=label, round=rnd)
                            r["serving_cpu_s"] = tree_cpu_s(sv.proc.pid) - cpu0
                            r["cube_cpu_s"] = sum(_proc_cpu_s(x.proc.pid) for x in cube.servers.values()) - cube0
                            r["serving_cpu_ms"] = r["serving_cpu_s"] * 1e3 / max(1, r["requests"])
                            r["cube_cpu_ms"] = r["cube_cpu_s"] * 1e3 / max(1, r["requests"])
                            r["floor_ms"] = floors[backend_of[label]][b]["floor"]
                            rounds.append(r)
                            print(f"  {label:<24} {transport:<6} batch {b:>4} clients {c} round {rnd}: "
                                  f"{r['rps']:8.1f} requests/s ({r['rps'] * b:9.0f} rows/s)  p50 {r['p50_ms']:6.2f} ms  "
                                  f"p99 {r['p99_ms']:6.2f} ms  failed {r['failed']}  CPU/request: serving "
                                  f"{r['serving_cpu_ms']:.2f} ms (floor {r['floor_ms']:.2f} ms, "
                                  f"{r['serving_cpu_ms'] / r['floor_ms']:.1f}x), cube {r['cube_cpu_ms']:.2f} ms",
                                  flush=True)
        results = _aggregate(rounds, args.duration)
        for label, (sv, url, _) in servers.items():
            text = storage.session().get(url + "/metrics", timeout=5).text
            runs = sum(float(ln.split()[-1]) for ln in text.splitlines()
                       if ln.startswith("elastic_ctr_serving_predictor_runs_total"))
            reqs = sum(float(ln.split()[-1]) for ln in text.splitlines()
                       if ln.startswith("elastic_ctr_serving_requests_total") and 'code="200"' in ln)
            print(f"{label}: {reqs:.0f} requests answered with {runs:.0f} predictor runs "
                  f"(concurrent requests combined: {reqs / max(runs, 1):.2f} requests per run)")
        overload, slow = {}, {}
        from bench.overload import format_row, format_slow_row, overload_row, slow_clients_row

        payloads = [(body, {"Content-Type": "application/json"}) for body, _, _ in encode_batches(rows, 256)]
        small = next(body for body, _, _ in encode_batches(rows, 8))
        for label, (sv, url, _) in servers.items():
            if args.overload_connections > 0:  # bench/overload.py: more connections than serving can take
                overload[label] = overload_row(url, payloads, args.overload_connections, args.duration)
                print(f"{label}:" + format_row(overload[label], 256), flush=True)
            if args.slow_connections > 0:  # tests/slow_clients.py's test, as figures
                slow[label] = slow_clients_row(url, small, args.slow_connections)
                print(f"{label}:" + format_slow_row(slow[label], args.slow_connections), flush=True)
    many = len(servers) > 1
    print("\n|" + (" server |" if many else "") + " transport | batch | clients | requests/s | rows/s | p50 ms | "
          "p99 ms | failed | serving CPU ms/request | in process ms | floor ms (alone: model + cube) | serving / floor |")
    print("|" + ("---|" if many else "") + "---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        f = floors[backend_of[r["server"]]][r["batch"]]
        print("|" + (f" {r['server']} |" if many else "") + f" {r['transport']} | {r['batch']} | {r['clients']} | "
              f"{r['rps']:.0f} | {r['rps'] * r['batch']:.0f} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['failed']} | {r['serving_cpu_ms']:.2f} | "
              f"{f[r['transport']]:.2f} | {f['floor']:.2f} ({f['model']:.2f} + {f['cube']:.2f}) | "
              f"{r['serving_cpu_ms'] / f['floor']:.2f}x |")
    for label, o in overload.items():
        print(f"\noverload{f' ({label})' if many else ''} (JSON, batch 256, {o['connections']} connections; clients "
              f"wait Retry-After after a 503): {o['ok_rps']:.0f} requests/s answered 200, p50 {o['p50_ms']:.1f} ms, "
              f"p99 {o['p99_ms']:.1f} ms, 503 {o['share_503'] * 100:.1f} %, readiness probe p99 "
              f"{o['probe_p99_ms']:.1f} ms")
    for label, r in slow.items():
        print(f"slow clients{f' ({label})' if many else ''}:" + format_slow_row(r, args.slow_connections))
    if many:  # the servers side by side: CPU per request at 4 clients (or the most tried) by transport and batch
        top = max(int(x) for x in args.clients.split(","))
        cells = [(t, b) for t in transports for b in batches]
        print("\n| server | " + " | ".join(f"{t} {b} CPU ms" for t, b in cells)
              + " | overload 200/s | overload 503 % | overload probe p99 ms | slow: live / ready / infer ms |")
        print("|---|" + "---:|" * (len(cells) + 4))
        for label in servers:
            row = [next((r["serving_cpu_ms"] for r in results if r["server"] == label and r["transport"] == t
                         and r["batch"] == b and r["clients"] == top), float("nan")) for t, b in cells]
            o, sl = overload.get(label), slow.get(label)
            print(f"| {label} | " + " | ".join(f"{x:.2f}" for x in row) + " | "
                  + (f"{o['ok_rps']:.0f} | {o['share_503'] * 100:.1f} | {o['probe_p99_ms']:.1f}" if o else "- | - | -")
                  + " | " + (" / ".join(f"{sl[k][1]:.1f}" for k in ("live", "ready", "infer")) if sl else "-") + " |")
    la = os.getloadavg()
    print(f"load average during the run: {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs "
          "(other work on the machine lowers these figures)")

    def pick(server, b, c, k, transport="json"):
        return next((r[k] for r in results if r["batch"] == b and r["clients"] == c and r["transport"] == transport
                     and r["server"] == server), float("nan"))

    top = max(int(x) for x in args.clients.split(","))
    if len(backends) > 1:  # the backends side by side: each one's figures over the first's
        ref = next(label for label in servers if backend_of[label] == backends[0])
        print(f"\nagainst {ref} ({top} clients): serving CPU per request, p99, requests/s")
        print("| server | " + " | ".join(f"{t} {b}: CPU / p99 / requests/s" for t in transports for b in batches) + " |")
        print("|---|" + "---:|" * (len(transports) * len(batches)))
        for label in servers:
            if label == ref:
                continue
            cells = [f"{pick(label, b, top, 'serving_cpu_ms', t) / pick(ref, b, top, 'serving_cpu_ms', t):.2f}x / "
                     f"{pick(label, b, top, 'p99_ms', t) / pick(ref, b, top, 'p99_ms', t):.2f}x / "
                     f"{pick(label, b, top, 'rps', t) / pick(ref, b, top, 'rps', t):.2f}x"
                     for t in transports for b in batches]
            print(f"| {label} | " + " | ".join(cells) + " |")
    for label in servers:  # one line per server (per dense backend by default)
        extra = label[len(backend_of[label]):].strip()
        print(f"serving backend={backend_of[label]}" + (f" args='{extra}'" if extra else "")
              + f" batch1_cpu_ms={pick(label, 1, top, 'serving_cpu_ms'):.3f}"
              f" batch256_cpu_ms={pick(label, 256, top, 'serving_cpu_ms'):.3f}"
              f" batch1_p50_ms={pick(label, 1, 1, 'p50_ms'):.2f} batch1_p99_ms_at_{top}={pick(label, 1, top, 'p99_ms'):.2f}"
              f" batch1_qps_at_{top}={pick(label, 1, top, 'rps'):.0f} batch256_qps_at_{top}={pick(label, 256, top, 'rps'):.0f}"
              f" binary_batch1_cpu_ms={pick(label, 1, top, 'serving_cpu_ms', 'binary'):.3f}"
              f" binary_batch256_cpu_ms={pick(label, 256, top, 'serving_cpu_ms', 'binary'):.3f}"
              f" grpc_batch1_cpu_ms={pick(label, 1, top, 'serving_cpu_ms', 'grpc'):.3f}"
              f" grpc_batch256_cpu_ms={pick(label, 256, top, 'serving_cpu_ms', 'grpc'):.3f}"
              f" batch1_floor_ms={pick(label, 1, top, 'floor_ms'):.3f} batch256_floor_ms={pick(label, 256, top, 'floor_ms'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
