"""The steps and readings of tests/containers/test_stack.py: the stack's transfer and cube
state as its pods answer it, a client load through the serving Service, a second version
published from the host, a transfer restarted in the middle of its rollout, and the log
lines a clean run must not print. ``RESULTS`` gathers every case's figures.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from runtime import role_specs
from tests.containers.kube import Cluster
from tests.containers.traffic import LoadStats, ServiceLoad

#: the pods' port (``runtime.role_specs.PORTS``)
FILES_PORT = role_specs.PORTS["fileserver"]["http"]
CONTROL_PORT = role_specs.PORTS["cube-server"]["http"]
TRANSFER_PORT = role_specs.PORTS["cube-transfer"]["http"]

REPO = Path(__file__).resolve().parents[2]
#: every case's figures, written to ``<tmp>/stack-results.json`` at the end
RESULTS: dict = {}


def terminal_lines(request, prefix: str):
    """A ``say(line)`` that writes ``"<prefix>: <line>"`` to pytest's terminal (shown
    without -s: the figures the container tests report)."""
    tr = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        line = f"{prefix}: {line}"
        if tr is not None:
            tr.write_line(line)
        else:  # pragma: no cover
            print(line)
    return say
#: what must never appear in a role's output (a crash, Paddle's signal handler, gunicorn
#: reporting a killed worker, an exception at interpreter exit)
FORBIDDEN = ("Traceback", "FatalError", "Termination signal", "Segmentation fault", "Exception ignored",
             "Error in atexit", "Unhandled exception", "was sent SIG", "exited with code")


def need(state: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in state]
    if missing:
        pytest.skip(f"an earlier step did not produce {missing}")


def transfer_url(c: Cluster) -> str:
    return f"http://{c.live_pods('cube-transfer')[0].ip}:{TRANSFER_PORT}"


def dict_info(c: Cluster) -> dict:
    """The transfer's ``/dict/info`` as JSON, read with its owner's reader (``{}`` while it
    does not answer)."""
    from runtime.formats.dict_info import DictInfoError, fetch_dict_info

    try:
        return fetch_dict_info(transfer_url(c), timeout_s=3).to_json()
    except (DictInfoError, IndexError):
        return {}


def cube_versions(c: Cluster) -> dict[str, object]:
    """Each live cube pod's served version, from its server's own ``/status``."""
    out = {}
    for w in ("cube-2s-shard-0", "cube-2s-shard-1"):
        for p in c.live_pods(w):
            try:
                out[p.name] = requests.get(f"http://{p.ip}:{CONTROL_PORT}/status", timeout=3).json().get("version")
            except (requests.RequestException, ValueError):
                out[p.name] = None
    return out


#: ``cube transfer --max-rollout-attempts`` (its default: the manifest does not set it)
MAX_ROLLOUT_ATTEMPTS = 3
#: seconds a deleted pod stays among a Service's endpoints (endpoints controller + kube-proxy)
PROPAGATION_S = 1.0


def serving_endpoints(c: Cluster):
    return lambda: [(p.name, p.ip) for p in c.endpoints("serving", propagation_s=PROPAGATION_S)]


def check_no_errors(c: Cluster) -> None:
    assert not c.errors, "harness recorded errors:\n" + "\n".join(c.errors)


def start_load(state: dict, say) -> ServiceLoad:
    from runtime.serving.client import encode_batches, load_rows

    c = state["cluster"]
    if "bodies" not in state:
        rows = load_rows([str(state["test_rows"])], "criteo", limit=4000)
        state["bodies"] = [b for b, _, _ in encode_batches(rows, 16)]
    load = ServiceLoad(serving_endpoints(c), state["bodies"], threads=2, rate=30.0, max_s=400.0).start()
    state["load"] = load
    return load


def stop_load(state: dict) -> LoadStats:
    load = state.pop("load")
    return load.stop()


def answers(ip: str) -> bool:
    try:
        return requests.get(f"http://{ip}:{CONTROL_PORT}/status", timeout=2).status_code == 200
    except requests.RequestException:
        return False


# ----------------------------------------------------------------------------- 4c. transfer restarted
PUBLISH = r"""
import glob, json, sys
import numpy as np
from runtime.trainer import set_paddle_flags
set_paddle_flags()
from runtime.formats.seqfile import read_sequence_file
from runtime.formats import features
from runtime.trainer.export import export_version
src, root, extra, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
meta = json.load(open(src + "/dense/model_meta.json"))
parts = [read_sequence_file(f) for f in sorted(glob.glob(src + "/sparse/part-*"))]
keys = np.concatenate([k for k, _ in parts])
values = np.concatenate([v for _, v in parts]) * np.float32(1.0 + seed / 100)
# keys no row ever looks up (slot bits far above the 26 slots): they only make the rollout longer
more = (np.uint64(1) << np.uint64(60)) + np.arange(extra, dtype=np.uint64) * np.uint64(7919)
rng = np.random.default_rng(seed)
keys = np.concatenate([keys, more])
values = np.concatenate([values, rng.normal(0, 0.01, (extra, values.shape[1])).astype(np.float32)])
rec = export_version(root, slots=features.DEFAULT_SLOTS, fmt="criteo", dim=int(values.shape[1]),
                     layers=meta.get("layers") or [128, 64, 32], keys=keys, values=values,
                     metrics={}, training={"note": "container test: another version"},
                     token=sys.stdin.read().strip(), seed=seed)
print("PUBLISHED", rec.id, len(keys))
"""
#: keys added to a published version so that its rollout lasts long enough to be interrupted
EXTRA_KEYS = 1_200_000


def publish(c: Cluster, stack: dict, seed: int) -> tuple[int, float]:
    """Publishes a new base into the file server pod from the host, as trainer 0 would (the
    served version's table, scaled, plus EXTRA_KEYS keys; a seeded head): ``python -c`` with
    ``runtime.trainer.export.export_version`` (``python -m runtime.trainer.export`` sends no
    upload token, so it cannot publish to the file server)."""
    fs = c.live_pods("fileserver")[0]
    src = c.volume_dir(fs.name, "files") / "versions" / str(stack["trained_version"])
    token = c.secrets["fileserver-upload-token"]["token"]
    t0 = time.monotonic()
    pub = subprocess.run([sys.executable, "-c", PUBLISH, str(src), f"http://{fs.ip}:{FILES_PORT}", str(EXTRA_KEYS), str(seed)],
                         input=token, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert pub.returncode == 0, pub.stdout[-2000:] + pub.stderr[-3000:]
    return int(re.search(r"PUBLISHED (\d+) (\d+)", pub.stdout).group(1)), time.monotonic() - t0


def restart_transfer_mid_rollout(stack: dict, say, case: str, how: str, seed: int) -> None:
    """Publishes a version, waits until the transfer's rollout of it is under way, then
    restarts the transfer pod (``how``: ``delete`` = the Kubernetes way, ``kill`` = a crash),
    and checks that the rollout completes on every cube pod with the client sending."""
    c: Cluster = stack["cluster"]
    v1 = dict_info(c).get("version")
    load = start_load(stack, say)
    v2, published = publish(c, stack, seed)
    # the transfer sees the donefile line at its next poll: restart it once the rollout is under way
    seen = c.wait_for(f"rollout of {v2} under way",
                      lambda: (lambda i: i if (i.get("rollout") or {}).get("version") == v2 or i.get("version") == v2
                               else None)(dict_info(c)), timeout_s=120, every_s=0.05)
    assert seen.get("version") != v2, f"the rollout of {v2} finished before the transfer could be restarted: {seen}"
    phase = seen["rollout"]["phase"]
    old = c.live_pods("cube-transfer")[0]
    t_kill = time.monotonic()
    term = c.delete_pod(old.name) if how == "delete" else c.kill_pod(old.name)
    new = c.pods[term.replacement]
    c.wait_ready([new.name], timeout_s=120)
    done = c.wait_for(f"version {v2} served everywhere",
                      lambda: (lambda i: i if i.get("version") == v2 and i.get("status") == "serving" else None)(dict_info(c)),
                      timeout_s=240, every_s=0.5)
    finished = time.monotonic() - t_kill
    versions = cube_versions(c)
    history = requests.get(transfer_url(c) + "/dict/deploy/history", timeout=5).json()
    entries = [h for h in history.get("history", []) if h.get("version") == v2]
    # serving follows the new version (both pods): the client is answered by it
    c.wait_for(f"serving answers version {v2}", lambda: str(v2) in load.stats.by_version, timeout_s=120)
    time.sleep(2)
    stats = stop_load(stack)
    ce = term.containers[0]
    RESULTS[case] = {"v1": v1, "v2": v2, "how": how, "publish_s": round(published, 1), "restarted_in_phase": phase,
                     "transfer_exit_code": ce.exit_code, "transfer_exit_s": ce.seconds, "sigkilled": ce.sigkilled,
                     "rollout_done_after_restart_s": round(finished, 1), "cube": versions,
                     "history_of_v2": entries, "load": stats.__dict__}
    say(f"({case[0]}) published {v2} ({EXTRA_KEYS} extra keys) in {published:.1f} s; {how} of the transfer in phase "
        f"{phase}: {term.summary()}; {v2} served everywhere {finished:.1f} s after; cube pods {versions}")
    say(f"({case[0]}) transfer history of {v2}: " + "; ".join(
        f"attempt {h.get('attempt')} {h.get('status')} resumed={h.get('resumed')} {h.get('seconds')} s" for h in entries))
    pick = re.compile(r"SIGTERM|stopp|Abort|unload|resum|Trigging|Finished|given up", re.I)
    for label, pod in (("old", old), ("new", new)):
        lines = [ln for ln in log_text(c, pod.containers[0]).splitlines() if pick.search(ln)]
        RESULTS[case][f"{label}_transfer_log"] = lines[-12:]
        for ln in lines[-5:]:
            say(f"({case[0]})   {label} transfer: {ln[-200:]}")
    say(f"({case[0]}) client: {stats.line()}")
    for e in stats.errors:
        say(f"({case[0]}) client error: {e}")
    stack["version"] = v2
    assert set(versions.values()) == {v2}, versions
    assert done["shard_num"] == 2 and done["replica_num"] == 2
    if how == "delete":
        harness = [ln for ln in (c.store.workdir / "harness.log").read_text(errors="replace").splitlines()
                   if old.name in ln]
        assert ce.exit_code == 0 and not ce.sigkilled, (term.summary() + "\nharness: " + "\n".join(harness[-10:])
                                                         + "\n" + log_text(c, old.containers[0])[-3000:])
    assert stats.failed == 0 and stats.ok > 0, stats.line()
    check_no_errors(c)


def forbidden_log_lines(c: Cluster) -> dict[str, list[str]]:
    """``pod/container`` -> up to 5 of its log lines holding a ``FORBIDDEN`` marker (a
    traceback, an error a clean stop must not print), for every container the run started."""
    bad = {}
    for cr in c.all_containers:
        if cr.id is None:
            continue
        hits = [ln for ln in log_text(c, cr).splitlines() if any(f in ln for f in FORBIDDEN)]
        if hits:
            bad[f"{cr.pod.name}/{cr.name}"] = hits[:5]
    return bad


def log_text(c: Cluster, cr) -> str:
    if cr.log_path.exists():
        return cr.log_path.read_text(errors="replace")
    proc = c.docker("logs", cr.id, check=False)
    return proc.stdout + proc.stderr
