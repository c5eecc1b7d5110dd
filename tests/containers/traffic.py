"""A bounded background client for the lifecycle cases: v2 ``infer`` requests (the demo
client's request bodies) to the serving Service's endpoints, the way a Service routes.

Routing: each request goes to one of the Service's endpoints at that moment (ready pods
that are not terminating, from ``kube.Cluster.endpoints``), round robin, over one
keep-alive connection per pod (keyed by pod name). A refused connection (a pod that stopped listening before
the endpoints noticed) fails over to the next endpoint (``failovers``). When a keep-alive
connection that was idle is found closed by the server before any byte of an answer
(``RemoteDisconnected``/reset on a reused connection), the request is sent once more on
another endpoint (``stale_retries``): what an HTTP client does with a pooled connection.
Everything else is a failure: an HTTP status other than 200, a timeout, a reset on a fresh
connection, no endpoint for 10 s.

``mark(pod_ip)`` tags the requests in flight to that pod at that moment (call it just before
SIGTERM): their outcomes are counted in ``inflight_at_mark`` / ``inflight_completed``, and a
tagged request is never retried, so "every in-flight request completes" is measured, not
assumed.

``check_answers``: every answer's outputs are compared with the first answer to the same
request body at the same ``model_version``; one that differs by more than ``ANSWER_TOL``
is counted in ``mismatched`` (an answer mixing two versions, e.g. the dense model of one
with embeddings of another or of an empty cube shard, scores differently).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LoadStats:
    requests: int = 0
    mismatched: int = 0
    mismatches: list = field(default_factory=list)  # up to 10: (seconds, pod, body index, version, max diff)
    ok: int = 0
    failed: int = 0
    failovers: int = 0
    stale_retries: int = 0
    stale: list = field(default_factory=list)  # (seconds since the last mark, pod, error) per stale retry
    inflight_at_mark: int = 0
    inflight_completed: int = 0
    seconds: float = 0.0
    by_pod: dict = field(default_factory=dict)
    by_version: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)

    def line(self) -> str:
        return (f"requests={self.requests} ok={self.ok} failed={self.failed} failovers={self.failovers} "
                f"stale_retries={self.stale_retries} {self.stale} mismatched={self.mismatched} inflight_at_mark={self.inflight_at_mark} "
                f"inflight_completed={self.inflight_completed} seconds={self.seconds:.1f} "
                f"by_pod={self.by_pod} versions={self.by_version}")


class _Retry(Exception):
    pass


#: largest difference between two answers to one body at one version still taken as equal
ANSWER_TOL = 1e-6


def _outputs(answer: dict) -> list[float]:
    """Every number of a v2 inference answer's outputs, in order."""
    out: list[float] = []
    for o in answer.get("outputs") or []:
        data = o.get("data") or []
        out.extend(float(x) for x in data)
    return out


class ServiceLoad:
    """Closed-loop load at about ``rate`` requests/s over ``threads`` threads, bounded by
    ``max_s`` seconds (it stops by itself). ``endpoints()`` -> ``[(pod name, ip)]``."""

    def __init__(self, endpoints: Callable[[], list[tuple[str, str]]], bodies: list[bytes], port: int = 8000,
                 threads: int = 2, rate: float = 30.0, timeout_s: float = 15.0, max_s: float = 300.0,
                 path: str = "/v2/models/ctr/infer", check_answers: bool = False):
        self.endpoints, self.bodies, self.port = endpoints, bodies, port
        self.threads, self.rate, self.timeout_s, self.max_s, self.path = threads, rate, timeout_s, max_s, path
        self.check_answers = check_answers
        self._reference: dict[tuple[int, str], list[float]] = {}  # (body index, version) -> outputs
        self.stats = LoadStats()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._inflight: dict[int, tuple[str, bool]] = {}  # request seq -> (pod ip, tagged)
        self._seq = 0
        self._t0 = 0.0
        self._mark_t: float | None = None

    def start(self) -> "ServiceLoad":
        self._t0 = time.monotonic()
        for k in range(self.threads):
            t = threading.Thread(target=self._run, args=(k,), daemon=True, name=f"load-{k}")
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> LoadStats:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=self.timeout_s + 5)
        self.stats.seconds = time.monotonic() - self._t0
        return self.stats

    def mark(self, pod_ip: str) -> int:
        """Tags the requests in flight to ``pod_ip`` now; returns how many."""
        with self.lock:
            self._mark_t = time.monotonic()
            n = 0
            for seq, (ip, tagged) in list(self._inflight.items()):
                if ip == pod_ip and not tagged:
                    self._inflight[seq] = (ip, True)
                    n += 1
            self.stats.inflight_at_mark += n
            return n

    def _fail(self, msg: str) -> None:
        with self.lock:
            self.stats.failed += 1
            if len(self.stats.errors) < 10:
                self.stats.errors.append(f"{time.monotonic() - self._t0:.2f}s {msg}")

    def _run(self, k: int) -> None:
        conns: dict[str, http.client.HTTPConnection] = {}
        gap = self.threads / self.rate if self.rate > 0 else 0.0
        i, nxt = k, time.monotonic()
        deadline = self._t0 + self.max_s
        rr = k
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                if gap:
                    delay = nxt - time.monotonic()
                    if delay > 0:
                        self._stop.wait(delay)
                    nxt = max(nxt + gap, time.monotonic() - gap)
                idx = i % len(self.bodies)
                i += self.threads
                with self.lock:
                    self.stats.requests += 1
                rr += 1
                self._one(self.bodies[idx], conns, rr, idx)
        finally:
            for c in conns.values():
                c.close()

    def _one(self, body: bytes, conns: dict, rr: int, idx: int = 0) -> None:
        tried: set[str] = set()
        retried_stale = False
        t_wait = time.monotonic()
        while True:
            eps = [e for e in self.endpoints() if e[1] not in tried]
            if not eps:
                if time.monotonic() - t_wait > 10:
                    self._fail(f"no endpoint for 10 s (tried {sorted(tried)})")
                    return
                time.sleep(0.05)
                tried.clear()
                continue
            name, ip = eps[rr % len(eps)]
            key = (name, ip)  # per pod: a replacement pod may take over its predecessor's address
            conn = conns.get(key)
            reused = conn is not None
            if conn is None:
                conn = conns[key] = http.client.HTTPConnection(ip, self.port, timeout=self.timeout_s)
            with self.lock:
                self._seq += 1
                seq = self._seq
                self._inflight[seq] = (ip, False)
            try:
                conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                status = r.status
            except ConnectionRefusedError:
                conn.close()
                conns.pop(key, None)
                tagged = self._done(seq)
                if tagged:
                    self._fail(f"{name}: in flight at SIGTERM, refused")
                    return
                with self.lock:
                    self.stats.failovers += 1
                tried.add(ip)
                continue
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                conns.pop(key, None)
                tagged = self._done(seq)
                if reused and not retried_stale and not tagged:
                    retried_stale = True
                    with self.lock:
                        self.stats.stale_retries += 1
                        since = None if self._mark_t is None else round(time.monotonic() - self._mark_t, 3)
                        self.stats.stale.append((since, name, f"{type(exc).__name__}: {exc}"))
                    tried.add(ip)
                    continue
                self._fail(f"{name}: {type(exc).__name__}: {exc}" + (" (in flight at SIGTERM)" if tagged else ""))
                return
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conns.pop(key, None)
                tagged = self._done(seq)
                self._fail(f"{name}: {type(exc).__name__}: {exc}" + (" (in flight at SIGTERM)" if tagged else ""))
                return
            tagged = self._done(seq)
            if status != 200:
                self._fail(f"{name}: HTTP {status}: {data[:200]!r}" + (" (in flight at SIGTERM)" if tagged else ""))
                return
            try:
                answer = json.loads(data)
                version = answer.get("model_version")
            except ValueError:
                answer, version = {}, None
            if self.check_answers:
                self._check(answer, name, idx, str(version))
            with self.lock:
                self.stats.ok += 1
                if tagged:
                    self.stats.inflight_completed += 1
                self.stats.by_pod[name] = self.stats.by_pod.get(name, 0) + 1
                self.stats.by_version[str(version)] = self.stats.by_version.get(str(version), 0) + 1
            return

    def _check(self, answer: dict, pod: str, idx: int, version: str) -> None:
        got = _outputs(answer)
        with self.lock:
            ref = self._reference.setdefault((idx, version), got)
            if ref is got:
                return
            worst = max((abs(a - b) for a, b in zip(ref, got)), default=0.0) if len(ref) == len(got) else float("inf")
            if worst > ANSWER_TOL:
                self.stats.mismatched += 1
                if len(self.stats.mismatches) < 10:
                    self.stats.mismatches.append((round(time.monotonic() - self._t0, 2), pod, idx, version, worst))

    def _done(self, seq: int) -> bool:
        with self.lock:
            _, tagged = self._inflight.pop(seq, ("", False))
            return tagged
