"""The control roles' HTTP servers under hostile and heavy clients, as processes: the file
server, the cube server's control port, the cube agent and the cube transfer, each started
with ``elastic-ctr`` from ``--tree`` (default this checkout; another checkout, e.g. a
worktree of an earlier commit, to compare two servers in one sitting). Loopback only,
bounded in count and time. Serving's rows are ``make bench-serving``'s (overload and slow
clients) and ``tests/lifecycle/test_serving_stop.py``'s.

Per role, three rows:

- slow: the latency of the probes and of one route, best of 3 without and the one call with
  64 connections open that send a header line per second (``tests/slow_clients.py``);
- load: ``--clients`` keep-alive clients (threads of one process) sending the route back
  to back for ``--duration`` s, while ``/readyz`` is timed every 0.1 s: requests/s, p50 and
  p99 of the route, the probe's p99 and max, errors;
- stop: ``--clients`` keep-alive clients sending through a SIGTERM (the file server: as many
  downloads of a 64 MiB file in flight, each checked whole): answered 200, lost (an error
  other than a refused connection), the exit code and the seconds from the signal to the
  exit.

Last line per role: ``http_role <role> slow_ms=<route with> load_rps=<x> probe_p99_ms=<y>
stop_lost=<n> stop_exit=<code> stop_s=<s>``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.slow_clients import check_answered, latency  # noqa: E402

BIG_BYTES = 64 << 20
ROUTES = {"fileserver": "/donefile", "cube-server": "/status", "cube-agent": "/status", "cube-transfer": "/dict/info"}


def _free_port() -> int:
    """A port for a tree whose roles cannot bind port 0 and report it (``--port-file``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Role:
    """``elastic-ctr ARGS`` of ``tree`` as a process on 127.0.0.1; ``port``: its HTTP port."""

    def __init__(self, tree: Path, name: str, args: list[str], port_flag: str, work: Path):
        self.name, self.log = name, work / f"{name}.log"
        self.port_file = work / f"{name}.ports.json"
        reports = (tree / "runtime" / "bound_ports.py").exists()
        port = 0 if reports else _free_port()
        argv = [sys.executable, "-m", "runtime.cli", *args, "--host", "127.0.0.1", port_flag, str(port)]
        if port_flag != "--port":
            argv += ["--port", "0" if reports else str(_free_port())]
        if reports:
            argv += ["--port-file", str(self.port_file)]
        env = dict(os.environ, PYTHONPATH=str(tree), ELASTIC_CTR_CREDENTIALS_DIR=str(work / "credentials"))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        if reports:
            while not self.port_file.exists():
                self._alive(deadline)
            ports = json.loads(self.port_file.read_text())
            port = ports["http"] if "http" in ports else ports["agent"]
        self.url = f"http://127.0.0.1:{port}"
        while True:
            self._alive(deadline)
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass

    def _alive(self, deadline: float) -> None:
        if self.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text()[-3000:]}")
        time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start_role(tree: Path, role: str, work: Path) -> Role:
    d = work / role
    d.mkdir(parents=True)
    if role == "fileserver":
        (d / "files").mkdir()
        (d / "files" / "donefile").write_text("1\n")
        (d / "files" / "big.bin").write_bytes(os.urandom(BIG_BYTES))
        return Role(tree, role, ["fileserver", "--root", str(d / "files")], "--port", d)
    if role == "cube-server":
        return Role(tree, role, ["cube", "server", "--shard", "0", "--shard-num", "1", "--insecure-no-auth"],
                    "--http-port", d)
    if role == "cube-agent":
        return Role(tree, role, ["cube", "agent", "--server-http", "http://127.0.0.1:9", "--work-dir", str(d / "w"),
                                 "--insecure-no-auth"], "--port", d)
    from runtime.formats.topology import Topology

    topo = Topology.build("ctr_embedding", [[("127.0.0.1:9", "http://127.0.0.1:9", "http://127.0.0.1:9")]]).write(
        d / "topology.json")
    (d / "root").mkdir()
    # a checkout from before the flags carried their unit names them without it
    old = "--poll-interval" in (tree / "runtime" / "cube" / "cli.py").read_text()
    poll, reconcile = ("--poll-interval", "--reconcile-interval") if old else ("--poll-seconds", "--reconcile-every-seconds")
    return Role(tree, role, ["cube", "transfer", "--topology", str(topo), "--root", str(d / "root"), "--work-dir",
                             str(d / "w"), poll, "1", reconcile, "0", "--insecure-no-auth"],
                "--port", d)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def load_row(url: str, route: str, clients: int, duration_s: float) -> dict:
    end = time.perf_counter() + duration_s
    times: list[float] = []
    errors = [0]

    def client() -> None:
        with requests.Session() as s:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    ok = s.get(url + route, timeout=10).status_code == 200
                except requests.RequestException:
                    ok = False
                if ok:
                    times.append(time.perf_counter() - t0)
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    probes = []
    while time.perf_counter() < end:
        probes.append(latency(url + "/readyz"))
        time.sleep(0.1)
    for t in threads:
        t.join(15)
    return {"rps": round(len(times) / duration_s, 1), "p50_ms": round(_pct(times, 0.5) * 1e3, 2),
            "p99_ms": round(_pct(times, 0.99) * 1e3, 2), "probe_p99_ms": round(_pct(probes, 0.99) * 1e3, 2),
            "probe_max_ms": round(max(probes) * 1e3, 2), "errors": errors[0]}


def stop_row(role: Role, name: str, clients: int) -> dict:
    ok, lost, refused = [0], [], [0]
    t_signal = [math.inf]
    want = hashlib.md5((Path(role.log).parent / "files" / "big.bin").read_bytes()).hexdigest() \
        if name == "fileserver" else None
    started = threading.Barrier(clients + 1)

    def download() -> None:
        started.wait()
        try:
            r = requests.get(role.url + "/big.bin", timeout=60)
            good = r.status_code == 200 and hashlib.md5(r.content).hexdigest() == want
            ok[0] += good
            if not good:
                lost.append(f"{r.status_code} {len(r.content)} bytes")
        except requests.RequestException as exc:
            lost.append(type(exc).__name__)

    def sender() -> None:
        started.wait()
        with requests.Session() as s:
            while True:
                try:
                    r = s.get(role.url + ROUTES[name], timeout=10)
                except requests.ConnectionError as exc:
                    if "refused" in str(exc).lower():
                        refused[0] += 1
                        return
                    lost.append(type(exc).__name__)
                    if time.monotonic() > t_signal[0] + 30:
                        return
                    continue
                if r.status_code == 200:
                    ok[0] += 1
                else:
                    lost.append(str(r.status_code))

    threads = [threading.Thread(target=download if want else sender, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.3)
    t_signal[0] = time.monotonic()
    role.proc.send_signal(signal.SIGTERM)
    code = role.proc.wait(60)
    took = time.monotonic() - t_signal[0]
    for t in threads:
        t.join(60)
    return {"answered": ok[0], "lost": len(lost), "lost_what": sorted(set(lost))[:4], "exit": code,
            "exit_s": round(took, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout whose roles run")
    ap.add_argument("--roles", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    ap.add_argument("--clients", type=int, default=64, help="clients of the load row (and of the stop row: 8)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of the load row")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    print(f"tree {tree} ({subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=tree, capture_output=True, text=True).stdout.strip()})", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-http-roles-") as tmp:
        for name in args.roles:
            role = start_role(tree, name, Path(tmp))
            try:
                route = ROUTES[name]
                u = role.url
                slow = check_answered({"healthz": lambda: latency(u + "/healthz"),
                                       "readyz": lambda: latency(u + "/readyz"),
                                       route: lambda: latency(u + route)}, u)
                slow_ms = {k: [round(x * 1e3, 2) for x in v] for k, v in slow.items()}
                print(f"{name} slow (ms without, with 64 slow connections): {slow_ms}", flush=True)
                load = load_row(u, route, args.clients, args.duration)
                print(f"{name} load ({args.clients} clients, {args.duration:g} s): {load}", flush=True)
                stop = stop_row(role, name, 8)
                print(f"{name} stop (8 clients in flight at SIGTERM): {stop}", flush=True)
                print(f"http_role {name} slow_ms={slow_ms[route][1]} load_rps={load['rps']} "
                      f"probe_p99_ms={load['probe_p99_ms']} stop_lost={stop['lost']} stop_exit={stop['exit']} "
                      f"stop_s={stop['exit_s']}", flush=True)
            finally:
                role.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
