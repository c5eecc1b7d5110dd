"""Load from ``wrk`` (a C HTTP load generator, Debian's package) for the serving benchmarks,
and the comparison of two servers' v2 answers.

- ``write_bodies``: pre-encoded request bodies -> one file, a body a line (JSON bodies have
  no newline), read by ``bench/wrk_post.lua``.
- ``run_wrk``: runs ``wrk`` for a fixed duration with that script -> ``parse_wrk``'s figures.
- ``parse_wrk``: wrk's text report (with ``--latency``) -> requests, requests/s, p50/p99,
  errors. The report's format: wrk's ``src/wrk.c`` (``print_stats_header``,
  ``print_stats_latency``, the "N requests in Ts" and "Non-2xx or 3xx responses" lines).
- ``compare_answers``: two Open Inference Protocol v2 JSON answers -> the differences
  (empty when equal: same model, version, output names, datatypes, shapes, and data equal
  once read as the datatype, so ``0.1`` and ``0.10000000149011612`` are the same FP32).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

LUA_SCRIPT = Path(__file__).resolve().parent / "wrk_post.lua"

#: wrk's time units (``src/units.c``) in milliseconds
_TIME_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
           "UINT64": np.uint64, "UINT32": np.uint32, "BOOL": np.bool_}


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed a report this parser does not read."""


def _ms(text: str, where: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise WrkError(f"wrk report: {where}: {text!r} is not a duration")
    return float(m.group(1)) * _TIME_MS[m.group(2)]


def parse_wrk(text: str) -> dict:
    """wrk's report (run with ``--latency``) -> ``{"requests": int, "duration_s": float,
    "rps": float, "p50_ms": float, "p99_ms": float, "non_2xx": int, "socket_errors": int}``.
    ``rps`` is wrk's own "Requests/sec" (requests completed / the run's duration). Raises
    ``WrkError`` naming the line that is missing."""
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+(?:us|ms|s|m|h)),", text, re.M)
    if not m:
        raise WrkError(f"wrk report: no 'N requests in T' line in:\n{text}")
    requests, duration_ms = int(m.group(1)), _ms(m.group(2), "duration")
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    if not m:
        raise WrkError(f"wrk report: no 'Requests/sec' line in:\n{text}")
    rps = float(m.group(1))
    pct = {}
    for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)\s*$", text, re.M):
        pct[p] = _ms(v, f"latency {p}%")
    if "50" not in pct or "99" not in pct:
        raise WrkError(f"wrk report: no latency distribution (run wrk with --latency) in:\n{text}")
    m = re.search(r"^\s*Non-2xx or 3xx responses:\s+(\d+)", text, re.M)
    non_2xx = int(m.group(1)) if m else 0
    m = re.search(r"^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text, re.M)
    socket_errors = sum(int(x) for x in m.groups()) if m else 0
    return {"requests": requests, "duration_s": duration_ms / 1e3, "rps": rps, "p50_ms": pct["50"],
            "p99_ms": pct["99"], "non_2xx": non_2xx, "socket_errors": socket_errors}


def write_bodies(bodies: list[bytes], path: str | Path) -> Path:
    """Writes ``bodies`` (request bodies, bytes) to ``path``, one a line, for
    ``wrk_post.lua``. Raises ``ValueError`` for an empty list or a body with a newline."""
    if not bodies:
        raise ValueError("bodies: no request bodies to write")
    for k, b in enumerate(bodies):
        if b"\n" in b or b"\r" in b:
            raise ValueError(f"bodies[{k}]: a request body with a line break cannot be sent by wrk_post.lua")
    path = Path(path)
    path.write_bytes(b"\n".join(bodies) + b"\n")
    return path


def wrk_path(wrk: str = "wrk") -> str:
    """The wrk executable. Raises ``WrkError`` when it is not installed."""
    found = shutil.which(wrk)
    if not found:
        raise WrkError(f"{wrk}: not found (install it: bash scripts/install-wrk.sh, Debian's package 'wrk')")
    return found


def run_wrk(url: str, path: str, bodies_file: str | Path, connections: int, duration_s: float,
            threads: int = 1, wrk: str = "wrk", timeout_s: float = 30.0) -> dict:
    """``connections`` keep-alive connections POSTing the bodies of ``bodies_file`` in turn
    to ``url`` + ``path`` for ``duration_s`` s (wrk's closed loop: each connection sends its
    next request when the answer came) -> ``parse_wrk``'s figures. ``threads``: wrk's
    threads (1: its CPU stays small next to the servers'). Raises ``WrkError``."""
    cmd = [wrk_path(wrk), "-t", str(threads), "-c", str(connections), "-d", f"{duration_s:g}s",
           "--timeout", f"{timeout_s:g}s", "--latency", "-s", str(LUA_SCRIPT), url,
           "--", str(bodies_file), path, "application/json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30)
    if r.returncode != 0:
        raise WrkError(f"wrk exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return parse_wrk(r.stdout)


def _outputs(doc: Any, who: str) -> tuple[dict, list[str]]:
    if not isinstance(doc, dict):
        return {}, [f"{who}: not a JSON object"]
    outs = doc.get("outputs")
    if not isinstance(outs, list):
        return {}, [f"{who}: no 'outputs' array"]
    by = {}
    for o in outs:
        if isinstance(o, dict) and isinstance(o.get("name"), str):
            by[o["name"]] = o
    return by, []


def compare_answers(a: Any, b: Any, names: tuple[str, str] = ("a", "b")) -> list[str]:
    """Differences between two v2 inference answers (parsed JSON documents): model name,
    model version (as strings), the set of outputs, and per output its datatype, shape and
    data read as the datatype (FP32 data compared as float32, exactly). Returns [] when
    they answer the same."""
    na, nb = names
    oa, errs_a = _outputs(a, na)
    ob, errs_b = _outputs(b, nb)
    diffs = errs_a + errs_b
    if diffs:
        return diffs
    for key in ("model_name", "model_version"):
        va, vb = a.get(key), b.get(key)
        if (None if va is None else str(va)) != (None if vb is None else str(vb)):
            diffs.append(f"{key}: {na} {va!r}, {nb} {vb!r}")
    if set(oa) != set(ob):
        diffs.append(f"outputs: {na} {sorted(oa)}, {nb} {sorted(ob)}")
    for name in sorted(set(oa) & set(ob)):
        x, y = oa[name], ob[name]
        if x.get("datatype") != y.get("datatype"):
            diffs.append(f"{name}.datatype: {na} {x.get('datatype')!r}, {nb} {y.get('datatype')!r}")
            continue
        if list(x.get("shape") or []) != list(y.get("shape") or []):
            diffs.append(f"{name}.shape: {na} {x.get('shape')}, {nb} {y.get('shape')}")
            continue
        dtype = _DTYPES.get(x.get("datatype"), object)
        try:
            da = np.asarray(x.get("data"), dtype=dtype).ravel()
            db = np.asarray(y.get("data"), dtype=dtype).ravel()
        except (TypeError, ValueError) as exc:
            diffs.append(f"{name}.data: not {x.get('datatype')} values ({exc})")
            continue
        if da.shape != db.shape:
            diffs.append(f"{name}.data: {na} {da.size} elements, {nb} {db.size}")
        elif not np.array_equal(da, db):
            k = int(np.flatnonzero(da != db)[0])
            diffs.append(f"{name}.data: {int((da != db).sum())} of {da.size} elements differ (first: element {k}, "
                         f"{na} {da[k]!r}, {nb} {db[k]!r})")
    return diffs


def loads(body: bytes, who: str) -> Any:
    """A JSON answer's document. Raises ``ValueError`` naming ``who``."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ValueError(f"{who}: answer is not JSON ({exc}): {body[:200]!r}") from None
