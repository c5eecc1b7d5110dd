"""Benchmark: one cube-server vs redis-server (MGET), same data, same lean client.

Run with ``make bench-cube`` (installs redis-server first) or
``.venv/bin/python bench/bench_cube.py [--keys 1000000] [--dim 10] [--seconds 4]``.

1. Generates ``--keys`` random uint64 keys x ``--dim`` float32 values (seeded), writes
   them as 2 SequenceFiles and times the builder (2 shards, tar + md5 included).
2. Starts, on 127.0.0.1 free ports, one cube-server (``elastic-ctr cube server``, 1 shard,
   loaded through its HTTP control API) and one redis-server (``--save '' --appendonly no``,
   loaded with MSET: key = the 8 key bytes, value = the 4*dim value bytes).
3. Drives each with 1/2/4/8 client processes; every client sends batches of ``--batch``
   random existing keys over one persistent connection (pre-encoded requests; cube frames
   per runtime/cube/protocol.py, redis RESP ``MGET``), decodes the values with numpy, and
   stops after ``--seconds`` s or ``--max-requests`` requests.
4. Reports QPS, mean and p99 latency (ms), the server's CPU per request (us, from
   utime+stime in /proc/<pid>/stat over the run) and its RSS (MiB, /proc/<pid>/status).

``--lookup-only``: instead, times in-process (CPU time) the lookup of ``--batch`` random
existing keys with the dict file's index layout (``ShardDict.lookup``: index slot, keys
row, values row) and with the server's inline table (``runtime/cube/table.py``), and prints
``lookup_us_per_batch index=<us> inline=<us>``.

Ends with: ``cube_vs_redis qps_ratio_at_4=<x> cpu_ratio=<redis cpu/req / cube cpu/req>
cube_cpu_us=<cube cpu/req at 4 clients> cube_rss_mib=<z>``. Every process it started is
stopped by PID (runtime.proc.ProcessGroup), also on failure.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime import role_specs  # noqa: E402
from runtime.cube import protocol  # noqa: E402
from runtime.cube.builder import build  # noqa: E402
from runtime.formats.seqfile_writer import write_sequence_file  # noqa: E402
from runtime.proc import ProcessGroup, free_port, wait_for_port  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def recv_exact(s: socket.socket, buf: bytearray, n: int, have: int = 0) -> None:
    """Receives into ``buf`` until it holds ``n`` bytes (``have`` already there)."""
    mv = memoryview(buf)
    while have < n:
        got = s.recv_into(mv[have:n])
        if not got:
            raise ConnectionError("server closed the connection")
        have += got


# ----------------------------------------------------------------- clients (one per process)
def _timed_loop(s, exchange, n_frames, seconds, max_requests, start_evt, q):
    """The measurement loop both clients share: ``exchange(i)`` sends frame ``i`` and
    reads and checks its reply; latencies (s) go to ``q``; stops after ``seconds`` s or
    ``max_requests`` requests."""
    lat = []
    start_evt.wait()
    t_end = time.perf_counter() + seconds
    i = 0
    while i < max_requests:
        t0 = time.perf_counter()
        exchange(i % n_frames)
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        i += 1
        if t1 >= t_end:
            break
    s.close()
    q.put(lat)


def _connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def cube_client(port, batches, dim, seconds, max_requests, start_evt, q):
    s = _connect(port)
    frames = [protocol.encode_request(b) for b in batches]
    size = protocol.reply_size(len(batches[0]), dim)
    buf = bytearray(size)

    def exchange(i):
        s.sendall(frames[i])
        recv_exact(s, buf, 4)
        n = protocol.LEN.unpack_from(buf, 0)[0] + 4
        if n != size:
            raise RuntimeError(f"unexpected reply of {n} bytes")
        recv_exact(s, buf, n, 4)
        _, _, _, found, values = protocol.decode_reply(buf)
        if not found.all():
            raise RuntimeError("a key was not found")

    _timed_loop(s, exchange, len(frames), seconds, max_requests, start_evt, q)


def redis_client(port, batches, dim, seconds, max_requests, start_evt, q):
    s = _connect(port)
    vbytes = 4 * dim
    frames = []
    for b in batches:
        parts = [f"*{len(b) + 1}\r\n$4\r\nMGET\r\n".encode()]
        kb = b.astype("<u8").tobytes()
        parts += [b"$8\r\n" + kb[8 * j:8 * j + 8] + b"\r\n" for j in range(len(b))]
        frames.append(b"".join(parts))
    n = len(batches[0])
    head = f"*{n}\r\n".encode()
    item = f"${vbytes}\r\n".encode()
    rec = len(item) + vbytes + 2
    size = len(head) + n * rec  # every key exists: fixed-size reply
    buf = bytearray(size)

    def exchange(i):
        s.sendall(frames[i])
        recv_exact(s, buf, size)
        if buf[:len(head)] != head:
            raise RuntimeError(f"unexpected redis reply {bytes(buf[:40])!r}")
        recs = np.frombuffer(buf, np.uint8, n * rec, len(head)).reshape(n, rec)
        recs[:, len(item):len(item) + vbytes].copy().view(np.float32)  # decode like the cube client

    _timed_loop(s, exchange, len(frames), seconds, max_requests, start_evt, q)


def drive(kind, port, pid, keys, dim, procs, args) -> dict:
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(1000 + procs)
    start_evt = ctx.Event()
    q = ctx.Queue()
    target = cube_client if kind == "cube" else redis_client
    workers = []
    for w in range(procs):
        batches = [keys[rng.integers(0, len(keys), args.batch)] for _ in range(64)]
        p = ctx.Process(target=target, args=(port, batches, dim, args.seconds, args.max_requests, start_evt, q))
        p.start()
        workers.append(p)
    time.sleep(0.5)  # connect and encode first
    c0, t0 = cpu_s(pid), time.perf_counter()
    start_evt.set()
    lats = []
    try:
        for _ in workers:
            lats.extend(q.get(timeout=args.seconds + 60))
    finally:
        for p in workers:
            p.join(10)
            if p.is_alive():
                p.kill()
    wall, c1 = time.perf_counter() - t0, cpu_s(pid)
    lat = np.array(lats) * 1e3
    return {"qps": len(lats) / wall, "mean_ms": lat.mean(), "p99_ms": np.percentile(lat, 99),
            "cpu_us": (c1 - c0) * 1e6 / len(lats), "rss_mib": rss_mib(pid), "requests": len(lats)}


def lookup_only(keys, values, args) -> int:
    from runtime.cube import dictfile
    from runtime.cube.kernel import KERNEL
    from runtime.cube.table import InlineTable

    d = dictfile.make_shard_dict(keys, values, dict_name="bench", shard=0, shard_num=1, version=1)
    t = InlineTable.build(keys, values)
    rng = np.random.default_rng(3)
    qs = [keys[rng.integers(0, len(keys), args.batch)] for _ in range(256)]
    out = np.empty((args.batch, args.dim), np.float32)
    found = np.empty(args.batch, np.uint8)
    runs = {
        "index": lambda q: KERNEL.lookup(d.index, d.keys, d.values, q, out, found),
        "inline": lambda q: KERNEL.table_lookup(t.tab, t.tabf, t.sentinel, t.dim, q, out, found),
    }
    best = {}
    for _ in range(5):  # interleaved rounds, best of 5 (others may share the CPUs)
        for name, fn in runs.items():
            c0 = time.process_time()
            for _ in range(8):
                for q in qs:
                    fn(q)
            us = (time.process_time() - c0) * 1e6 / (8 * len(qs))
            best[name] = min(best.get(name, us), us)
    print(f"{args.keys} keys x {args.dim} float32, {args.batch} random existing keys per lookup, "
          f"kernel {KERNEL.name}; inline table {t.capacity} slots x {t.stride} B = {t.nbytes / 2**20:.0f} MiB")
    print(f"lookup_us_per_batch index={best['index']:.1f} inline={best['inline']:.1f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--procs", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=4.0, help="per configuration (s)")
    ap.add_argument("--max-requests", type=int, default=50_000, help="per client process")
    ap.add_argument("--skip-redis", action="store_true")
    ap.add_argument("--lookup-only", action="store_true", help="time the in-process lookup only")
    ap.add_argument("--io-mode", default="epoll", choices=("threads", "epoll"), help="cube server's --io-mode")
    args = ap.parse_args()
    procs_list = [int(x) for x in args.procs.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-cube-"))
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(1, 2**64 - 1, int(args.keys * 1.01) + 10, dtype=np.uint64))
    keys = rng.permutation(keys)[:args.keys]
    values = rng.random((args.keys, args.dim), dtype=np.float32)
    raw_mib = (keys.nbytes + values.nbytes) / 2**20
    if args.lookup_only:
        return lookup_only(keys, values, args)
    half = args.keys // 2
    src = work / "sparse"
    src.mkdir()
    write_sequence_file(src / "part-00000", keys[:half], values[:half])
    write_sequence_file(src / "part-00001", keys[half:], values[half:])
    build_s = []
    for i in range(2):
        t0 = time.perf_counter()
        build([str(src)], work / "build2", "bench", 2, 1000 + i)
        build_s.append(time.perf_counter() - t0)
    res1 = build([str(src)], work / "build1", "bench", 1, 1000)
    print(f"builder: {args.keys} keys x {args.dim} float32, 2 shards, tar+md5: "
          f"{min(build_s):.2f} s best of 2 ({args.keys / min(build_s):,.0f} keys/s; runs {', '.join(f'{s:.2f}' for s in build_s)} s)",
          flush=True)

    rows = []
    with ProcessGroup(work / "logs", grace_s=5) as pg:
        spec = role_specs.cube_server(0, 1, role_specs.LOOPBACK, 0, 0, dict_name="bench",
                                      extra=["--io-mode", args.io_mode])
        from runtime import auth

        creds = auth.write_credentials(work / "credentials")
        headers = auth.Credential(role_specs.CUBE_CONTROL, creds).headers()
        cube = pg.start("cube-server", spec.argv(), cwd=str(Path(__file__).resolve().parent.parent),
                        env=auth.env_for(creds), port_file=True)
        bound = pg.bound_ports(cube)  # the ports the server bound, both accepting
        port, hport = bound["data"], bound["http"]
        import requests
        url = f"http://127.0.0.1:{hport}"
        r = requests.post(url + "/bg_load_base", json={"dir": str(Path(res1.output_dir) / "bench_part0"),
                                                       "version": 1000}, timeout=10, headers=headers)
        r.raise_for_status()
        while (st := requests.get(url + "/status", timeout=10).json())["bg_state"] == "loading":
            time.sleep(0.1)
        if st["bg_state"] != "loaded":
            raise SystemExit(f"cube-server failed to load: {st['bg_error']}")
        requests.post(url + "/enable", json={"version": 1000}, timeout=10, headers=headers).raise_for_status()
        servers = [("cube", port, cube.proc.pid)]
        if not args.skip_redis:
            rport = free_port()
            redis_bin = shutil.which("redis-server")
            if not redis_bin:
                raise SystemExit("redis-server not found: run bash bench/ensure_redis.sh")
            red = pg.start("redis-server", [redis_bin, "--bind", "127.0.0.1", "--port", str(rport), "--save", "",
                                            "--appendonly", "no", "--protected-mode", "no"])
            wait_for_port("127.0.0.1", rport, 30, red.proc, "redis-server", red.log_path)
            import redis
            rc = redis.Redis(host="127.0.0.1", port=rport)
            kb, vb = keys.astype("<u8").tobytes(), values.astype("<f4").tobytes()
            vl = 4 * args.dim
            chunk = 20000
            for a in range(0, args.keys, chunk):
                b = min(args.keys, a + chunk)
                rc.mset({kb[8 * j:8 * j + 8]: vb[vl * j:vl * j + vl] for j in range(a, b)})
            assert rc.dbsize() == args.keys
            rc.close()
            servers.append(("redis", rport, red.proc.pid))
        idle_rss = {name: rss_mib(pid) for name, _, pid in servers}
        for name, p, pid in servers:
            for n in procs_list:
                m = drive(name, p, pid, keys, args.dim, n, args)
                m.update(server=name, procs=n)
                rows.append(m)
                print(f"  {name:5s} x{n}: {m['qps']:8.0f} QPS  mean {m['mean_ms']:.2f} ms  p99 {m['p99_ms']:.2f} ms  "
                      f"server cpu {m['cpu_us']:.0f} us/req  rss {m['rss_mib']:.0f} MiB", flush=True)
        pg.stop_all()
    shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.keys} keys x {args.dim} float32 (raw {raw_mib:.1f} MiB), batch {args.batch} random existing "
          f"keys, {os.cpu_count()} CPUs, clients and server on one machine; RSS after load: "
          + ", ".join(f"{k} {v:.0f} MiB" for k, v in idle_rss.items()))
    print("| server | client procs | QPS | mean ms | p99 ms | server CPU us/req | server RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for m in rows:
        print(f"| {m['server']} | {m['procs']} | {m['qps']:.0f} | {m['mean_ms']:.2f} | {m['p99_ms']:.2f} | "
              f"{m['cpu_us']:.0f} | {m['rss_mib']:.0f} |")
    print(f"builder throughput: {args.keys / min(build_s):,.0f} keys/s ({args.keys} keys, 2 shards, tar+md5)")
    at4 = {m["server"]: m for m in rows if m["procs"] == 4}
    cube4 = at4.get("cube")
    cube_rss = max(m["rss_mib"] for m in rows if m["server"] == "cube")
    print(f"targets: qps_ratio_at_4 >= 5, cube cpu <= 150 us/req, cube rss <= {1.6 * raw_mib + 60:.0f} MiB")
    if cube4 and "redis" in at4:
        red4 = at4["redis"]
        print(f"cube_vs_redis qps_ratio_at_4={cube4['qps'] / red4['qps']:.2f} "
              f"cpu_ratio={red4['cpu_us'] / cube4['cpu_us']:.2f} cube_cpu_us={cube4['cpu_us']:.0f} "
              f"cube_rss_mib={cube_rss:.0f}")
    elif cube4:
        print(f"cube_vs_redis qps_ratio_at_4=nan cpu_ratio=nan cube_cpu_us={cube4['cpu_us']:.0f} "
              f"cube_rss_mib={cube_rss:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
