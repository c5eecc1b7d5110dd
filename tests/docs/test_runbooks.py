"""The runbooks' commands are the ones their container test plays: every ``kubectl`` line of
docs/runbooks/*.md is one the stand-in (tests/containers/kubectl_shim.py) plays, and its
port-forward and Secret reading work as kubectl's do (the whole runbook runs against the
containers in tests/containers/test_stack.py)."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from runtime import proc
from tests.containers import kubectl_shim, runbook

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "runbooks").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_kubectl_line_is_played(page):
    lines = runbook.kubectl_lines(page)
    assert lines, f"{page.name} has no kubectl command"
    for words in lines:
        ns, verb, _ = kubectl_shim.parse(words[1:])
        assert ns == "$NS", words


def test_the_rollback_runbook_sets_its_variables_and_runs_the_commands_it_documents():
    page = ROOT / "docs/runbooks/rollback-on-a-cluster.md"
    text = runbook.script(page, {"NS": "ns-x", "PORT": "1234", "VERSION": "42"})
    assert "NS=ns-x" in text and "PORT=1234" in text and "VERSION=42" in text
    assert 'elastic-ctr rollback --to "$VERSION" --transfer-url "http://127.0.0.1:$PORT"' in text
    assert "kubectl -n \"$NS\" exec deploy/cube-transfer -- elastic-ctr rollback --follow" in text
    with pytest.raises(KeyError, match="sets no NOPE="):
        runbook.script(page, {"NOPE": "1"})


def test_port_forward_and_get_secret_behave_like_kubectl(tmp_path):
    from runtime.fileserver.app import create_app
    from tests.helpers import ThreadedApp

    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "hello.txt").write_text("hi\n")
    app = ThreadedApp(create_app(tmp_path / "served", token="t" * 32))
    state = tmp_path / "state.json"
    kubectl_shim.write_state(state, "ns-x", {"files": app.url.split("//")[1].split(":")[0]}, {},
                             {"credentials-cube-control": {"current": "s3cr3t"}}, {})
    env = {kubectl_shim.STATE_ENV: str(state)}
    shim = [sys.executable, "-m", "tests.containers.kubectl_shim", "-n", "ns-x"]
    got = subprocess.run(shim + ["get", "secret", "credentials-cube-control", "-o", "jsonpath={.data.current}"],
                         cwd=ROOT, env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and base64.b64decode(got.stdout) == b"s3cr3t"
    wrong = subprocess.run(shim[:-1] + ["other", "get", "secret", "x", "-o", "jsonpath={.data.current}"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "the stack's is 'ns-x'" in wrong.stderr
    port = proc.free_port()
    remote = app.url.rsplit(":", 1)[1]
    pf = subprocess.Popen(shim + ["port-forward", "svc/files", f"{port}:{remote}"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, text=True)
    try:
        assert pf.stdout.readline().strip() == f"Forwarding from 127.0.0.1:{port} -> {remote}"
        r = requests.get(f"http://127.0.0.1:{port}/hello.txt", timeout=10)
        assert r.status_code == 200 and r.text == "hi\n"
    finally:
        pf.terminate()
        pf.wait(10)
        app.close()
    with pytest.raises(ValueError, match="not played here: kubectl -n ns-x delete pod x"):
        kubectl_shim.parse(["-n", "ns-x", "delete", "pod", "x"])
