"""What serving's HTTP layer costs per request, apart from serving's own work: a stand-in
ASGI app answering at once on the event loop, served the way a serving worker serves its app
(``runtime.serving.worker``) by the checkout ``--tree`` names, in a process of its own,
while one client process sends ``--requests`` GETs over ``--connections`` keep-alive
connections. Prints the server process's CPU microseconds per request (its user + system
time over the requests, from ``/proc``), per round; several ``--tree`` values are measured
in turn, round after round (``--rounds``), so their ratio comes from the same minutes.

Last line per tree: ``http_overhead tree=<path> us_per_request=<median over rounds>``.
"""
from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: the server: the tree's worker serving path around a stand-in app; prints its port, then
#: serves until stdin closes
SERVER = r"""
import os, sys, threading
from runtime.serving import worker

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

if os.path.exists(os.path.join("runtime", "limits.py")):  # a checkout from before runtime/web
    from runtime.limits import ServerLimits
else:
    from runtime.web.limits import ServerLimits
limits = ServerLimits()
if hasattr(worker, "http_server"):
    server = worker.http_server(app, "127.0.0.1", 0, limits, reuse_port=False).start()
    port = server.port
else:
    sock = worker.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = worker.uvicorn_server()(worker.uvicorn_config(app, limits), lambda: None, lambda: None)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    import time
    while not server.started:
        time.sleep(0.01)
print(port, flush=True)
sys.stdin.read()
os._exit(0)
"""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(tree: Path, requests: int, connections: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.Popen([sys.executable, "-c", SERVER], cwd=tree, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        per = requests // connections

        def client() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for _ in range(per):
                c.request("GET", "/x")
                r = c.getresponse()
                r.read()
            c.close()

        for _ in range(2):  # warm-up
            client()
        time.sleep(0.2)
        c0 = cpu_s(p.pid)
        threads = [threading.Thread(target=client) for _ in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (cpu_s(p.pid) - c0) / (per * connections) * 1e6
    finally:
        p.stdin.close()
        p.wait(10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, action="append", help="a checkout to measure (default: this one)")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    trees = [t.resolve() for t in (a.tree or [REPO])]
    out: dict[Path, list[float]] = {t: [] for t in trees}
    for r in range(a.rounds):
        for t in trees if r % 2 == 0 else trees[::-1]:
            us = one_round(t, a.requests, a.connections)
            out[t].append(us)
            print(f"round {r}: {t}: {us:.1f} us of server CPU per request", flush=True)
    for t, v in out.items():
        print(f"http_overhead tree={t} us_per_request={statistics.median(v):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
