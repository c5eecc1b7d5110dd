"""The overload row of the serving benchmark: more connections than the
workers can serve, at batch 256, and what each client sees.

``overload_row(url, payloads)`` opens ``connections`` keep-alive connections (threads in
a few client processes, so the clients' GIL does not pace the load) that send pre-encoded
requests back to back (closed loop; after a 503 a client waits its ``Retry-After``, as
the answer asks; ``--no-backoff``: it sends again at once, the harshest client) for
``duration_s`` s, while the parent probes ``/v2/health/ready`` every ``PROBE_S`` s. Returns
requests/s answered 200, p50/p99 latency of the 200s and of every answer, the share of
503s, errors, and the probes' p99 and max.

Run alone (``python bench/overload.py``), it sets up what ``bench/bench_serving.py`` sets
up (a local cube of 2 shards, ``elastic-ctr serve``, 2 workers x 1 thread) and measures
4 connections then ``--connections`` (64) at batch 256, JSON; last line
``serving_overload connections=<n> batch=256 ok_rps=<x> ok_rps_at_4=<y> p50_ms=<a> p99_ms=<b>
share_503=<s> probe_p99_ms=<p>``. ``bench_serving.py`` can call ``overload_row`` with its
own server and payloads.
"""
from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: seconds between two readiness probes during the load
PROBE_S = 0.1
PATH = "/v2/models/ctr/infer"


def _connection_loop(host: str, port: int, payloads: list, end: float, out: list, backoff: bool = True) -> None:
    """One closed-loop connection until ``end`` (perf_counter); appends (seconds, status)
    per answer (status 0: an error, the connection is then made again). ``backoff``: after
    a 503 wait its ``Retry-After`` seconds (else send again at once)."""
    c = http.client.HTTPConnection(host, port, timeout=60)
    i = 0
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        body, headers = payloads[i % len(payloads)]
        i += 1
        try:
            c.request("POST", PATH, body, headers)
            r = c.getresponse()
            r.read()
            status = r.status
            if r.will_close:
                c.close()
            if status == 503 and backoff:
                out.append((time.perf_counter() - t0, status))
                time.sleep(max(0.0, min(float(r.getheader("Retry-After") or 1), end - time.perf_counter())))
                continue
        except (OSError, http.client.HTTPException):
            status = 0
            c.close()
        out.append((time.perf_counter() - t0, status))
    c.close()


def _client_process(url: str, payloads: list, connections: int, duration_s: float, backoff: bool, q) -> None:
    u = urlsplit(url)
    end = time.perf_counter() + duration_s
    outs: list[list] = [[] for _ in range(connections)]
    ts = [threading.Thread(target=_connection_loop, args=(u.hostname, u.port, payloads[k::connections] or payloads,
                                                          end, outs[k], backoff)) for k in range(connections)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put([x for o in outs for x in o])


def _probe_loop(url: str, stop: threading.Event, out: list) -> None:
    u = urlsplit(url)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            c.request("GET", "/v2/health/ready")
            r = c.getresponse()
            r.read()
            c.close()
            out.append((time.perf_counter() - t0, r.status))
        except (OSError, http.client.HTTPException):
            out.append((time.perf_counter() - t0, 0))
        stop.wait(PROBE_S)


def overload_row(url: str, payloads: list[tuple[bytes, dict]], connections: int = 64, duration_s: float = 8.0,
                 processes: int = 4, backoff: bool = True) -> dict:
    """``connections`` closed-loop connections to serving at ``url`` sending ``payloads``
    ((body, headers) of ``POST /v2/models/ctr/infer``) for ``duration_s`` s (module
    docstring; ``backoff``: clients honour ``Retry-After``). Returns ``{"connections",
    "answers", "ok_rps", "p50_ms", "p99_ms"`` (200s),
    ``"p99_all_ms", "share_503", "errors", "probe_p99_ms", "probe_max_ms", "probes_failed"}``."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    processes = max(1, min(processes, connections))
    per = [connections // processes + (1 if k < connections % processes else 0) for k in range(processes)]
    ps = [ctx.Process(target=_client_process, args=(url, payloads[k::processes] or payloads, n, duration_s, backoff, q))
          for k, n in enumerate(per)]
    probes: list = []
    stop = threading.Event()
    prober = threading.Thread(target=_probe_loop, args=(url, stop, probes), daemon=True)
    for p in ps:
        p.start()
    prober.start()
    res = [x for _ in ps for x in q.get(timeout=duration_s + 120)]
    stop.set()
    for p in ps:
        p.join()
    prober.join(15)
    lat = np.array([r[0] for r in res]) * 1e3
    status = np.array([r[1] for r in res])
    ok = lat[status == 200]
    plat = np.array([p[0] for p in probes]) * 1e3
    pct = (lambda a, q_: float(np.percentile(a, q_)) if a.size else float("nan"))
    return {"connections": connections, "answers": int(status.size), "ok_rps": ok.size / duration_s,
            "p50_ms": pct(ok, 50), "p99_ms": pct(ok, 99), "p99_all_ms": pct(lat, 99),
            "share_503": float((status == 503).mean()) if status.size else float("nan"),
            "errors": int((~np.isin(status, [200, 503])).sum()), "probe_p99_ms": pct(plat, 99),
            "probe_max_ms": float(plat.max()) if plat.size else float("nan"),
            "probes_failed": sum(1 for p in probes if p[1] != 200)}


def slow_clients_row(url: str, infer_body: bytes, n: int = 64, settle_s: float = 2.5, tries: int = 5) -> dict:
    """The 64-slow-connection test (``tests/slow_clients.py``) as figures: the latency (ms)
    of ``GET /v2/health/live``, ``GET /v2/health/ready`` and ``POST /v2/models/ctr/infer``
    of ``infer_body`` (JSON), the best of ``tries`` without slow clients and the worst of
    ``tries`` with ``n`` connections open that trickle header lines (after ``settle_s``
    s). Returns ``{"live"|"ready"|"infer": (without_ms, with_ms)}``; ``inf`` for a call not
    answered 2xx within 5 s."""
    from tests.slow_clients import SlowClients, latency

    calls = {"live": lambda: latency(url + "/v2/health/live"), "ready": lambda: latency(url + "/v2/health/ready"),
             "infer": lambda: latency(url + PATH, data=infer_body, headers={"Content-Type": "application/json"})}
    before = {k: min(f() for _ in range(tries)) for k, f in calls.items()}
    with SlowClients(url, n=n):
        time.sleep(settle_s)
        after = {k: max(f() for _ in range(tries)) for k, f in calls.items()}
    return {k: (before[k] * 1e3, after[k] * 1e3) for k in calls}


def format_slow_row(r: dict, n: int = 64) -> str:
    """One line of ``slow_clients_row``'s figures."""
    return f"  {n} slow connections (without -> with, ms): " + ", ".join(
        f"{k} {a:.1f} -> {b:.1f}" for k, (a, b) in r.items())


def format_row(r: dict, batch: int) -> str:
    """One line of ``overload_row``'s figures."""
    return (f"  overload batch {batch} connections {r['connections']}: {r['ok_rps']:.1f} requests/s answered 200 "
            f"(p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; every answer p99 {r['p99_all_ms']:.1f} ms), "
            f"503: {r['share_503'] * 100:.1f} % of {r['answers']}, errors {r['errors']}; readiness probes "
            f"p99 {r['probe_p99_ms']:.1f} ms, max {r['probe_max_ms']:.1f} ms, failed {r['probes_failed']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    ap.add_argument("--connections", type=int, default=64, help="connections of the overload row (default 64)")
    ap.add_argument("--batch", type=int, default=256, help="rows per request (default 256)")
    ap.add_argument("--workers", type=int, default=2, help="serving worker processes (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="serving threads per worker (default 1, as serve's)")
    ap.add_argument("--no-backoff", action="store_true", help="clients send again at once after a 503")
    ap.add_argument("--serve-args", default="", help="more arguments for elastic-ctr serve, e.g. '--max-queue 8'")
    args = ap.parse_args()

    from bench.served import served_version, start_serving
    from runtime.serving.client import encode_batches

    with served_version("bench-overload-") as setup:
        _, url, _ = start_serving(setup.cube, setup.tmp / "serving", args.workers, args.threads, grpc=False,
                                   extra=tuple(args.serve_args.split()))
        rows = setup.rows
        payloads = [(body, {"Content-Type": "application/json"}) for body, _, _ in encode_batches(rows, args.batch)]
        overload_row(url, payloads[:8], 1, 1.0, 1)  # warm-up
        print(f"serving: {args.workers} worker(s) x {args.threads} threads {args.serve_args}; "
              f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}", flush=True)
        base = overload_row(url, payloads, 4, args.duration, 4)
        print(format_row(base, args.batch), flush=True)
        over = overload_row(url, payloads, args.connections, args.duration, backoff=not args.no_backoff)
        print(format_row(over, args.batch), flush=True)
    la = os.getloadavg()
    print(f"load average: {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs")
    print(f"serving_overload connections={over['connections']} batch={args.batch} ok_rps={over['ok_rps']:.1f} "
          f"ok_rps_at_4={base['ok_rps']:.1f} p50_ms={over['p50_ms']:.1f} p99_ms={over['p99_ms']:.1f} "
          f"share_503={over['share_503']:.3f} probe_p99_ms={over['probe_p99_ms']:.1f} backoff={not args.no_backoff}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
