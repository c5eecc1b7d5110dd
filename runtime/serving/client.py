"""Demo client (``elastic-ctr client``): sends test data to serving over the v2 API.

Reads rows (Criteo TSV/CSV or the slot format; files, globs or URLs), parses them with
``runtime.formats.features``, pre-encodes one Open Inference Protocol v2 request per
batch (``dense_features`` FP32 [n,13] with ``null`` for a missing value + ``feasigns``
UINT64 [n,26], or raw ``lines`` BYTES [n]), and sends them with N worker processes, each
over its own keep-alive HTTP/1.1 connection (``http.client``: ~10x less client CPU per
request than ``requests``) in its own process, so the client measures the server, not
its own GIL. No retries: a request that fails is counted as failed.

Report: requests, failed requests, rows scored, QPS (requests/s), p50/p99 latency (ms),
AUC over the scored rows (and per version), versions seen. ``--json-out`` writes it as
JSON; ``--predictions-out`` writes every scored row's prediction.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from runtime.evaluation import auc
from runtime import storage
from runtime.formats import features
from runtime.serving.ctr_model import DENSE, FEASIGNS, LINES, MODEL_NAME

log = logging.getLogger(__name__)

@dataclass
class Rows:
    """Parsed test rows: ``labels`` int64[n], ``dense`` float32[n,13] raw (NaN missing),
    ``feasigns`` uint64[n,S], ``lines`` the raw rows (str[n]), ``fmt``."""

    labels: np.ndarray
    dense: np.ndarray
    feasigns: np.ndarray
    lines: list
    fmt: str
    bad: int = 0


def load_rows(locations: list[str], fmt: str = "auto", slots=features.DEFAULT_SLOTS,
              limit: int | None = None) -> Rows:
    """Reads and parses rows from paths/globs/URLs (malformed rows are skipped and
    counted). Raises ``storage.LocationError`` if a location is missing."""
    files: list[str] = []
    for loc in locations:
        got = storage.expand(loc)
        if not got:
            raise storage.LocationError(f"{loc}: no such file")
        files += got
    lines: list[str] = []
    for f in files:
        for ln in storage.iter_lines(f):
            if ln.strip() and not features.is_header(ln):
                lines.append(ln)
                if limit and len(lines) >= limit:
                    break
        if limit and len(lines) >= limit:
            break
    if not lines:
        raise ValueError(f"no data rows in {locations}")
    if fmt == "auto":
        fmt = features.detect_format(lines[0])
    b = features.parse_lines(lines, fmt, slots)
    bad_idx = {i for i, _ in b.bad}
    good = [ln for i, ln in enumerate(lines) if i not in bad_idx]
    if b.bad:
        log.warning("%d malformed rows skipped (first: line %d: %s)", len(b.bad), b.bad[0][0] + 1, b.bad[0][1])
    return Rows(b.labels, b.dense, b.feasigns, good, fmt, len(b.bad))


def encode_batches(rows: Rows, batch_size: int, mode: str = "features") -> list[tuple[bytes, int, int]]:
    """One pre-encoded v2 request body per batch for the CTR model (its signature:
    ``runtime.serving.ctr_model``): list of (body, first row, row count)."""
    out = []
    n = len(rows.labels)
    for start in range(0, n, batch_size):
        end = min(n, start + batch_size)
        m = end - start
        if mode == "lines":
            req = {"inputs": [{"name": LINES, "datatype": "BYTES", "shape": [m], "data": rows.lines[start:end]}]}
        else:
            d = rows.dense[start:end].astype(np.float64).ravel()
            dl = [None if x != x else x for x in d.tolist()]  # NaN -> null (missing)
            req = {"inputs": [
                {"name": DENSE, "datatype": "FP32", "shape": [m, features.NUM_DENSE], "data": dl},
                {"name": FEASIGNS, "datatype": "UINT64", "shape": [m, rows.feasigns.shape[1]],
                 "data": rows.feasigns[start:end].ravel().tolist()}]}
        out.append((json.dumps(req, separators=(",", ":")).encode(), start, m))
    return out


@dataclass
class RunResult:
    """Outcome of a load run. Latencies in seconds; ``probs``/``versions`` per row (of
    the last answer for it; NaN / -1 if never answered); ``by_version`` counts answers."""

    requests: int = 0
    failed: int = 0
    seconds: float = 0.0
    latencies: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    by_version: dict = field(default_factory=dict)
    scored: list = field(default_factory=list)  # (label, prob, version) per answered row


class _Conn:
    """One keep-alive HTTP/1.1 connection (reconnects after an error)."""

    def __init__(self, url: str, timeout_s: float):
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self.c: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            self.c.request("POST", self.prefix + path, body, {"Content-Type": "application/json"})
            r = self.c.getresponse()
            return r.status, r.read()
        except BaseException:
            self.c.close()
            self.c = None
            raise

    def close(self) -> None:
        if self.c is not None:
            self.c.close()


def _worker(k: int, n_workers: int, url: str, bodies: list, total: int | None, deadline: float | None,
            until_file: str | None, timeout_s: float, path: str, rate: float, out) -> None:
    """One client worker (its own process and connection): requests ``k, k+N, k+2N, ...``
    (cycling over ``bodies`` when ``total`` is None) until a stop condition; puts its
    results on ``out``. ``rate``: this worker's share of requests/s (0 = no limit)."""
    conn = _Conn(url, timeout_s)
    lat, scored, errs, byv = [], [], [], {}
    failed = 0
    gap = 1.0 / rate if rate > 0 else 0.0
    next_t = time.perf_counter()
    i = k
    checked = 0.0
    try:
        while True:
            if total is not None and i >= total:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if until_file is not None and now - checked > 0.05:
                checked = now
                if os.path.exists(until_file):
                    break
            if gap:
                delay = next_t - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                next_t = max(next_t + gap, time.perf_counter() - gap)
            body, start, m = bodies[i % len(bodies)]
            i += n_workers
            t0 = time.perf_counter()
            try:
                status, data = conn.post(path, body)
            except (OSError, http.client.HTTPException) as exc:
                status, data = -1, f"{exc.__class__.__name__}: {exc}".encode()
            dt = time.perf_counter() - t0
            if status != 200:
                failed += 1
                if len(errs) < 5:
                    errs.append(f"HTTP {status}: {data[:300].decode('utf-8', 'replace')}")
                continue
            lat.append(dt)
            res = json.loads(data)
            v = int(res["model_version"])
            byv[v] = byv.get(v, 0) + 1
            scored.append((start, m, v, res["outputs"][0]["data"]))
    finally:
        conn.close()
        out.put((lat, failed, errs, byv, scored))


def run_load(url: str, bodies: list[tuple[bytes, int, int]], labels: np.ndarray, concurrency: int = 4,
             max_requests: int | None = None, duration_s: float | None = None, until_file: str | None = None,
             timeout_s: float = 10.0, model: str = MODEL_NAME, rate: float = 0.0) -> RunResult:
    """Sends ``bodies`` with ``concurrency`` worker processes (each with one keep-alive
    connection: a GIL-bound pool of threads would measure the client, not the server).
    Stops after one pass, or ``max_requests`` requests, or ``duration_s`` seconds, or
    once ``until_file`` exists (then cycling over the batches). ``rate``: requests/s
    over all workers (0 = as fast as the server answers). Returns a ``RunResult``."""
    import multiprocessing as mp

    res = RunResult()
    cycle = duration_s is not None or until_file is not None
    total = max_requests if max_requests is not None else (None if cycle else len(bodies))
    concurrency = max(1, min(concurrency, total if total is not None else concurrency))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t_start = time.monotonic()
    deadline = t_start + duration_s if duration_s is not None else None
    path = f"/v2/models/{model}/infer"
    procs = [ctx.Process(target=_worker, args=(k, concurrency, url, bodies, total, deadline, until_file,
                                               timeout_s, path, rate / concurrency if rate else 0.0, q),
                         daemon=True)
             for k in range(concurrency)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            lat, failed, errs, byv, scored = q.get()
            res.latencies += lat
            res.failed += failed
            res.errors += errs
            res.scored += scored
            for v, c in byv.items():
                res.by_version[v] = res.by_version.get(v, 0) + c
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    res.seconds = time.monotonic() - t_start
    res.requests = len(res.latencies) + res.failed
    return res


def summarize(res: RunResult, labels: np.ndarray) -> dict:
    """The report: counts, QPS, latency percentiles (ms), AUC overall and per version."""
    lat = np.array(res.latencies) * 1e3 if res.latencies else np.array([np.nan])
    ys, ps, vs = [], [], []
    for start, m, v, probs in res.scored:
        ys.append(labels[start:start + m])
        ps.append(np.asarray(probs, dtype=np.float64))
        vs.append(np.full(m, v))
    y = np.concatenate(ys) if ys else np.zeros(0)
    p = np.concatenate(ps) if ps else np.zeros(0)
    v = np.concatenate(vs) if vs else np.zeros(0)
    auc_by_v = {str(k): auc(y[v == k], p[v == k]) for k in sorted(set(v.tolist()))}
    return {
        "requests": res.requests,
        "failed_requests": res.failed,
        "rows_scored": int(y.size),
        "seconds": round(res.seconds, 3),
        "qps": round(res.requests / res.seconds, 1) if res.seconds > 0 else 0.0,
        "rows_per_s": round(y.size / res.seconds, 1) if res.seconds > 0 else 0.0,
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "auc": auc(y, p) if y.size else float("nan"),
        "auc_by_version": auc_by_v,
        "versions": {str(k): c for k, c in sorted(res.by_version.items())},
        "errors": res.errors[:5],
    }


def write_predictions(path: str, res: RunResult, labels: np.ndarray) -> None:
    """One line per answered row: ``row<TAB>label<TAB>probability<TAB>version``."""
    with open(path, "w") as f:
        for start, m, v, probs in res.scored:
            for j, pr in enumerate(probs):
                f.write(f"{start + j}\t{int(labels[start + j])}\t{pr:.9g}\t{v}\n")


def main(args) -> int:
    """``elastic-ctr client``: exit code 0 if every request succeeded, 1 otherwise."""
    slots = features.DEFAULT_SLOTS
    if args.slot_file:
        slots = features.load_slots(storage.read_bytes(args.slot_file).decode())
    try:
        rows = load_rows(args.data, args.format, slots)
    except (storage.LocationError, ValueError) as exc:
        print(f"elastic-ctr client: error: {exc}", file=sys.stderr)
        return 2
    bodies = encode_batches(rows, max(1, args.batch_size), args.mode)
    print(f"client: {len(rows.labels)} rows ({rows.fmt}), {len(bodies)} requests of up to {args.batch_size} rows, "
          f"{args.concurrency} workers -> {args.url}", flush=True)
    res = run_load(args.url, bodies, rows.labels, args.concurrency, args.max_requests, args.duration,
                   args.until_file, args.timeout, rate=args.rate)
    rep = summarize(res, rows.labels)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rep, indent=1))
    if args.predictions_out:
        write_predictions(args.predictions_out, res, rows.labels)
    print(f"client: requests={rep['requests']} failed={rep['failed_requests']} rows={rep['rows_scored']} "
          f"qps={rep['qps']} p50_ms={rep['p50_ms']} p99_ms={rep['p99_ms']} auc={rep['auc']:.4f} "
          f"versions={rep['versions']}", flush=True)
    for e in rep["errors"]:
        print(f"client: error: {e}", flush=True)
    return 0 if rep["failed_requests"] == 0 and rep["requests"] > 0 else 1
