"""The documentation's examples run as written: the request examples of docs/serving.md
("Calling it": the curl commands and the Python client) against a local ``elastic-ctr
serve`` over a local cube, and the README's preview (``elastic-ctr render ...
--diff-against``) against what the command prints for the dev stack today."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from runtime import proc

ROOT = Path(__file__).resolve().parents[2]
SERVING_PAGE = ROOT / "docs" / "serving.md"
TRITON_PYTHON = Path(os.environ.get("ELASTIC_CTR_TRITONCLIENT_PYTHON", ROOT / ".venv-tritonclient" / "bin" / "python"))
#: the line whose features docs/serving.md's examples send
EXAMPLE_LINE = "\t".join(["0", *map(str, range(1, 14)), *(format(97 * i + 5, "x") for i in range(26))])


def blocks(page: Path, section: str) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of ``page`` under the heading ``section``
    (up to the next heading of its level or above)."""
    text = page.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else None]
    return re.findall(r"^```(\w*)\n(.*?)^```", body, re.S | re.M)


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    from tests.helpers import cube_serving_lines, serving_args

    tmp = tmp_path_factory.mktemp("examples")
    rng = np.random.default_rng(3)
    lines = [EXAMPLE_LINE] + ["\t".join([str(i % 2)] + [str(int(rng.integers(0, 50))) for _ in range(13)]
                                        + [format(int(rng.integers(0, 30)), "x") for _ in range(26)]) for i in range(31)]
    version = 1_800_000_100
    with cube_serving_lines(tmp, lines, version, shards=2) as (cube, batch):
        role = cube.group.start("serving", proc.self_command() + serving_args(
            cube, tmp / "sv", workers=1, threads=2), port_file=True)
        bound = cube.group.bound_ports(role, 120)  # every port accepts from now on
        port, grpc_port = bound["http"], bound["grpc"]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            cube.group.check()
            try:
                if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            assert time.monotonic() < deadline, "serving not ready in 120 s"
            time.sleep(0.2)
        (tmp / "test.txt").write_text("\n".join(lines[:5]) + "\n")
        yield {"port": port, "grpc_port": grpc_port, "dir": tmp, "version": version, "lines": lines}


def _json_values(text: str) -> list:
    """The JSON documents printed one after another (curl -s adds no newline)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = dec.raw_decode(text, i)
        out.append(value)
    return out


def test_the_feasigns_in_the_example_are_the_lines(serving):
    from runtime.formats import features

    shell = next(t for lang, t in blocks(SERVING_PAGE, "Calling it") if lang in ("", "sh", "bash"))
    sent = json.loads(re.search(r"-d '(.*)'", shell, re.S).group(1))
    batch = features.parse_criteo_lines([EXAMPLE_LINE])
    by_name = {i["name"]: i["data"] for i in sent["inputs"]}
    assert by_name["feasigns"] == batch.feasigns[0].tolist()
    assert by_name["dense_features"] == batch.dense[0].tolist()


@pytest.mark.slow
def test_the_curl_examples_run_as_written(serving):
    shell = next(t for lang, t in blocks(SERVING_PAGE, "Calling it") if lang in ("", "sh", "bash"))
    assert "[...]" not in shell and "..." not in shell.replace("# ", "")  # no placeholder
    script = shell.replace("localhost:8000", f"localhost:{serving['port']}")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=serving["dir"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    meta, infer, predict = _json_values(r.stdout)
    assert meta["name"] == "ctr" and {i["name"] for i in meta["inputs"]} >= {"dense_features", "feasigns"}
    assert infer["id"] == "r1" and infer["model_version"] == str(serving["version"])
    out = {o["name"]: o for o in infer["outputs"]}["probability"]
    assert out["shape"] == [1, 1] and 0.0 < out["data"][0] < 1.0
    assert len(predict["predictions"] if "predictions" in predict else predict["probabilities"]) == 5


@pytest.mark.slow
def test_the_python_client_example_runs_as_written(serving):
    from tests import tools

    tools.need([TRITON_PYTHON], "Triton's clients", "make install (the .venv-tritonclient venv)")
    code = next(t for lang, t in blocks(SERVING_PAGE, "Calling it") if lang == "python")
    code = code.replace("localhost:8001", f"localhost:{serving['grpc_port']}")
    r = subprocess.run([str(TRITON_PYTHON), "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    p = float(re.search(r"\[\[([0-9.e-]+)\]\]", r.stdout).group(1))
    via_rest = requests.post(f"http://127.0.0.1:{serving['port']}/predict", json={"lines": [EXAMPLE_LINE]}).json()
    first = (via_rest.get("predictions") or via_rest.get("probabilities"))[0]
    assert abs(p - float(first if not isinstance(first, list) else first[0])) < 1e-5


@pytest.mark.parametrize("page, section", [("README.md", "Preview"), ("docs/resize.md", "Preview a change")])
def test_the_preview_shown_is_what_render_prints(tmp_path, page, section):
    """The "Preview" blocks of the README and the Resize page: each line and the summary as
    `elastic-ctr render --diff-against` prints them for the dev stack (lines a page folds,
    `... -1, -2`, stand for those)."""
    block = next(t for _, t in blocks(ROOT / page, section)).splitlines()
    cmds = [l.split("#")[0].removeprefix("$ ").split() for l in block if l.startswith("$ ")]
    assert [c[:2] for c in cmds] == [["elastic-ctr", "render"]] * 2
    run = lambda argv: subprocess.run([sys.executable, "-m", "runtime.cli", *argv[1:]], cwd=tmp_path,
                                      capture_output=True, text=True, timeout=300)
    first = run(cmds[0])
    assert first.returncode == 0, first.stderr[-2000:]
    second = run(cmds[1])
    assert second.returncode == 0, second.stderr[-2000:]
    printed = [" ".join(l.split()) for l in second.stdout.splitlines() if l.strip()]
    shown = [l for l in block if l and not l.startswith("$ ")]
    for line in shown:
        head = " ".join(line.split("...")[0].split())
        assert any(p.startswith(head) for p in printed), (line, printed)
    summary = next(p for p in printed if p.startswith("Resources:"))
    assert " ".join(shown[-1].split()) == summary, (shown[-1], summary)
