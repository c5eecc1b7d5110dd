"""runtime.auth (credentials per boundary, the check, the guard) and the agent's version
roots (runtime.cube.agent.sources), in-process."""
from __future__ import annotations

import os
import stat

import pytest
from flask import Flask

from runtime import auth, role_specs
from runtime.cube.agent.sources import SourceRefused, VersionRoots


def test_written_credentials_are_private_and_kept_on_a_second_write(tmp_path):
    d = auth.write_credentials(tmp_path / "c")
    cur = d / role_specs.CUBE_CONTROL / "current"
    assert stat.S_IMODE(os.stat(cur).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d / role_specs.CUBE_CONTROL).st_mode) == 0o700
    value = cur.read_text()
    auth.write_credentials(d)
    assert cur.read_text() == value and len(value.strip()) >= 32
    assert (d / role_specs.TRACKING / role_specs.TRACKING_PASSWORD).exists()


def test_check_reasons_and_rotation(tmp_path):
    d = auth.write_credentials(tmp_path / "c", [role_specs.CUBE_CONTROL])
    cred = auth.Credential(role_specs.CUBE_CONTROL, d)
    old = cred.current()
    assert auth.check([cred], f"Bearer {old}") is None
    assert auth.check([cred], None) == auth.MISSING
    assert auth.check([cred], f"Basic {old}") == auth.MALFORMED
    assert auth.check([cred], "Bearer") == auth.MALFORMED
    assert auth.check([cred], f"Bearer {old}x") == auth.WRONG
    new = auth.rotate(d, role_specs.CUBE_CONTROL)
    assert cred.current() == new  # re-read on change, same object
    assert auth.check([cred], f"Bearer {old}") is None and auth.check([cred], f"Bearer {new}") is None
    auth.retire_previous(d, role_specs.CUBE_CONTROL)
    assert auth.check([cred], f"Bearer {old}") == auth.WRONG
    assert auth.check([auth.Credential(role_specs.FILES_READ, d)], f"Bearer {new}") == auth.UNCONFIGURED


def test_a_role_without_its_credential_does_not_start(tmp_path):
    with pytest.raises(auth.CredentialError, match="cube-control.*--insecure-no-auth") as e:
        auth.control_guard("cube-agent", False, directory=tmp_path)
    assert str(tmp_path) in str(e.value)
    assert auth.control_guard("cube-agent", True, directory=tmp_path) is None


def test_guard_refuses_posts_401_json_and_counts(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from runtime.metrics.auth import AuthMetrics

    d = auth.write_credentials(tmp_path / "c", [role_specs.CUBE_CONTROL])
    cred = auth.Credential(role_specs.CUBE_CONTROL, d)
    app = Flask("t")
    calls = []
    app.add_url_rule("/enable", "enable", lambda: calls.append(1) or "ok", methods=["POST"])
    app.add_url_rule("/status", "status", lambda: "ok")
    reg = CollectorRegistry()
    auth.Guard("cube-server", auth.mutating(cred), AuthMetrics(reg)).install(app)
    c = app.test_client()
    assert c.get("/status").status_code == 200
    r = c.post("/enable", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "cube-control" in r.json["error"] and r.headers["WWW-Authenticate"]
    assert cred.current() not in r.get_data(as_text=True)
    assert not calls
    assert c.post("/enable", headers=cred.headers()).status_code == 200 and calls == [1]
    text = generate_latest(reg).decode()
    assert 'elastic_ctr_auth_refusals_total{endpoint="/enable",reason="wrong",role="cube-server"} 1.0' in text


@pytest.mark.parametrize("url", [
    "/data/x.tar", "file:///data/x.tar", "C:/x.tar", "http://fs:8080/versions/x.tar", "http://fs:8080/cube/../x.tar",
    "http://fs:8080/cube/%2e%2e/x.tar", "http://fs:8080/cube/a%2fb.tar", "http://u:p@fs:8080/cube/x.tar",
    "http://fs:8080/cube/x.tar?a=1", "http://fs:8080/cube/x.tar#f", "http://fs:9090/cube/x.tar",
    "http://fs.evil:8080/cube/x.tar", "http://fs:8080/cube//x.tar", "ftp://fs:8080/cube/x.tar",
    "http://fs:8080/cube/"])
def test_version_roots_refuse(url):
    with pytest.raises(SourceRefused):
        VersionRoots(["http://fs:8080/cube/"]).check(url)


def test_version_roots_accept_normalized():
    roots = VersionRoots(["HTTP://FS:80/cube", "s3://bucket/models/cube/"])
    assert roots.check("http://fs/cube/d/1/d_part0.tar") == "http://fs/cube/d/1/d_part0.tar"
    assert roots.check("http://FS:80/cube/d/1/d_part0.tar") == "http://fs/cube/d/1/d_part0.tar"
    assert roots.check("s3://bucket/models/cube/d/1/d_part0.tar").startswith("s3://bucket/models/cube/")
    assert VersionRoots([]).check("http://anything/x.tar") == "http://anything/x.tar"
    with pytest.raises(SourceRefused):
        VersionRoots([]).check("/local/x.tar")


def test_read_protected_file_server_and_storage_presenting_the_read_credential(tmp_path, monkeypatch):
    from runtime import storage, storage_write
    from runtime.fileserver.app import create_app
    from runtime.web.wsgi import WebServer

    d = auth.write_credentials(tmp_path / "c")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_bytes(b"model")
    app = create_app(tmp_path / "root", write=auth.Credential(role_specs.FILES_WRITE, d),
                     read=auth.Credential(role_specs.FILES_READ, d))
    with WebServer(app) as srv:
        import requests

        assert requests.get(f"{srv.url}/f", timeout=5).status_code == 401
        assert requests.get(f"{srv.url}/?format=json", timeout=5).status_code == 401
        assert requests.get(f"{srv.url}/metrics", timeout=5).status_code == 200
        assert requests.get(f"{srv.url}/readyz", timeout=5).status_code == 200
        monkeypatch.setenv(role_specs.CREDENTIALS_DIR_ENV, str(tmp_path / "elsewhere"))
        with pytest.raises(storage.LocationError, match="401"):
            storage.read_bytes(f"{srv.url}/f")
        monkeypatch.setenv(role_specs.CREDENTIALS_DIR_ENV, str(d))
        assert storage.read_bytes(f"{srv.url}/f") == b"model"  # the read credential, presented by storage
        storage_write.upload(tmp_path / "root" / "f", f"{srv.url}/g")  # the write credential, from the same directory
        assert (tmp_path / "root" / "g").read_bytes() == b"model"


@pytest.mark.parametrize("argv", [["cube", "server", "--shard", "0"], ["cube", "agent", "--work-dir", "w"]])
def test_a_control_role_without_its_credential_exits_2(tmp_path, argv):
    import subprocess
    import sys

    env = dict(os.environ, **{role_specs.CREDENTIALS_DIR_ENV: str(tmp_path / "none")})
    p = subprocess.run([sys.executable, "-m", "runtime.cli", *argv, "--host", "127.0.0.1", "--port", "0"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "cube-control" in p.stderr and "--insecure-no-auth" in p.stderr
