"""File server: listing (JSON/HTML), HEAD, Range, ETag/304, PUT auth, digests, path escapes.

Runs the app under ``runtime.web.wsgi`` in a thread (the same server as the CLI), and
sends raw HTTP for the path-escape cases so no client normalizes the path first.
"""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
import time

import pytest
import requests

from runtime import storage, storage_write
from runtime.fileserver.app import create_app, expected_digests
from runtime.formats import donefile
from runtime.web.wsgi import WebServer

TOKEN = "s3cret-token"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "versions" / "1" / "sparse").mkdir(parents=True)
    (root / "versions" / "1" / "sparse" / "part-00000").write_bytes(b"A" * 1000)
    (root / "versions" / "1" / "sparse" / "part-00001").write_bytes(b"B" * 10)
    (root / "hello.txt").write_text("hello world\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink(outside / "secret.txt", root / "link-out.txt")
    os.symlink(outside, root / "dir-out")
    os.symlink(root / "hello.txt", root / "link-in.txt")
    return root


@pytest.fixture
def server(tree):
    with WebServer(create_app(tree, token=TOKEN)) as s:
        yield s


def raw_get(port: int, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Sends a request line with ``target`` exactly as given; returns (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode("latin-1"))
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body


def test_healthz(server):
    r = requests.get(server.url + "/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_listing_json(server):
    r = requests.get(server.url + "/versions/1/sparse/?format=json")
    assert r.status_code == 200
    entries = r.json()["entries"]
    assert [e["name"] for e in entries] == ["part-00000", "part-00001"]
    assert entries[0] == {"name": "part-00000", "type": "file", "size": 1000, "mtime": entries[0]["mtime"]}
    assert isinstance(entries[0]["mtime"], float)
    # Accept header, and a directory named without its trailing slash.
    r = requests.get(server.url + "/versions/1", headers={"Accept": "application/json"})
    assert r.json()["entries"] == [{"name": "sparse", "type": "dir", "size": 0,
                                    "mtime": r.json()["entries"][0]["mtime"]}]


def test_listing_root_hides_links_out(server):
    names = {e["name"]: e["type"] for e in requests.get(server.url + "/?format=json").json()["entries"]}
    assert names == {"hello.txt": "file", "versions": "dir", "link-in.txt": "file"}


def test_listing_html(server):
    r = requests.get(server.url + "/versions/1/sparse/")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert 'href="/versions/1/sparse/part-00000"' in r.text


def test_get_head_range_etag(server):
    r = requests.get(server.url + "/versions/1/sparse/part-00000")
    assert r.status_code == 200 and r.content == b"A" * 1000
    etag, lm = r.headers["ETag"], r.headers["Last-Modified"]
    assert r.headers["Accept-Ranges"] == "bytes"
    h = requests.head(server.url + "/versions/1/sparse/part-00000")
    assert h.status_code == 200 and h.headers["Content-Length"] == "1000" and h.content == b""
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == b"A" * 10
    assert r.headers["Content-Range"] == "bytes 10-19/1000"
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"Range": "bytes=-5"})
    assert r.status_code == 206 and len(r.content) == 5
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"Range": "bytes=5000-"})
    assert r.status_code == 416
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b""
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"If-Modified-Since": lm})
    assert r.status_code == 304
    r = requests.get(server.url + "/versions/1/sparse/part-00000", headers={"If-None-Match": '"other"'})
    assert r.status_code == 200


def test_missing_is_404_json(server):
    r = requests.get(server.url + "/nope/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_put_requires_token(server, tree):
    r = requests.put(server.url + "/up/a.bin", data=b"x")
    assert r.status_code == 401 and "error" in r.json()
    r = requests.put(server.url + "/up/a.bin", data=b"x", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = requests.put(server.url + "/up/a.bin", data=b"x", headers={"Authorization": f"Basic {TOKEN}"})
    assert r.status_code == 401
    assert not (tree / "up" / "a.bin").exists()


def test_put_disabled_without_token(tree):
    with WebServer(create_app(tree, token=None)) as s:
        r = requests.put(s.url + "/up/a.bin", data=b"x", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 403
    assert not (tree / "up").exists()


def test_put_and_overwrite(server, tree):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = requests.put(server.url + "/up/deep/a.bin", data=b"x" * 3_000_000, headers=auth)
    assert r.status_code == 201, r.text
    assert r.json()["md5"] == hashlib.md5(b"x" * 3_000_000).hexdigest()
    assert (tree / "up" / "deep" / "a.bin").read_bytes() == b"x" * 3_000_000
    r = requests.put(server.url + "/up/deep/a.bin", data=b"new", headers=auth)
    assert r.status_code == 200
    assert requests.get(server.url + "/up/deep/a.bin").content == b"new"
    # no temporaries left behind
    assert sorted(os.listdir(tree / "up" / "deep")) == ["a.bin"]
    # PUT onto a directory
    assert requests.put(server.url + "/up/deep", data=b"x", headers=auth).status_code == 409


def test_put_digest_verified(server, tree):
    body = b"payload" * 100
    good = base64.b64encode(hashlib.md5(body).digest()).decode()
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = requests.put(server.url + "/d/ok", data=body, headers={**auth, "Content-MD5": good})
    assert r.status_code == 201
    for hdr in ({"Content-MD5": bad}, {"Digest": f"md5={bad}"}, {"Repr-Digest": f"md5=:{bad}:"},
                {"Content-Digest": f"sha-256=:{base64.b64encode(hashlib.sha256(b'x').digest()).decode()}:"},
                {"Content-MD5": "not base64!"}):
        r = requests.put(server.url + "/d/bad", data=body, headers={**auth, **hdr})
        assert r.status_code == 400, hdr
        assert "error" in r.json()
    assert sorted(os.listdir(tree / "d")) == ["ok"]  # nothing kept, no temporaries
    r = requests.put(server.url + "/d/ok2", data=body, headers={**auth, "Repr-Digest": f"md5=:{good}:"})
    assert r.status_code == 201


def test_expected_digests_parsing():
    md5 = hashlib.md5(b"a").digest()
    b64 = base64.b64encode(md5).decode()
    assert expected_digests({"Digest": f"SHA=xyz, md5={b64}"}) == {"md5": md5}
    with pytest.raises(ValueError, match="Content-MD5"):
        expected_digests({"Content-MD5": base64.b64encode(b"short").decode()})


def test_storage_upload_roundtrip(server, tree, tmp_path):
    """runtime.storage_write.upload/append_line and runtime.formats.donefile.read against the file server."""
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(5000))
    storage_write.upload(src, server.url + "/versions/2/sparse/part-00000", token=TOKEN)
    assert (tree / "versions/2/sparse/part-00000").read_bytes() == src.read_bytes()
    for vid, rel in ((2, "x"), (3, "y")):  # donefile.append: storage_write.append_line through the file server
        donefile.append(server.url, "base", donefile.DonefileRecord(id=vid, key=vid, input=rel), TOKEN)
    assert [r.id for r in donefile.read(server.url, "base")] == [2, 3]
    got = tmp_path / "back.bin"
    storage.download(server.url + "/versions/2/sparse/part-00000", got,
                     md5=hashlib.md5(src.read_bytes()).hexdigest())
    assert got.read_bytes() == src.read_bytes()
    with pytest.raises(storage.LocationError):
        storage_write.upload(src, server.url + "/x", token="wrong")


ESCAPES = [
    "/../outside/secret.txt",
    "/versions/../../outside/secret.txt",
    "/%2e%2e/outside/secret.txt",
    "/%2E%2E/outside/secret.txt",
    "/versions/%2e%2e/%2e%2e/outside/secret.txt",
    "/..%2foutside%2fsecret.txt",
    "/%2e%2e%2foutside%2fsecret.txt",
    "/..%5coutside%5csecret.txt",
    "/..\\outside\\secret.txt",
    "//etc/passwd",
    "/%2fetc%2fpasswd",
    "/etc/passwd%00",
    "/hello.txt%00.png",
    "/link-out.txt",
    "/dir-out/secret.txt",
    "/dir-out/",
    "/C:/Windows/win.ini",
    "/%252e%252e/outside/secret.txt",
]


@pytest.mark.parametrize("target", ESCAPES)
def test_path_escape_refused(server, target):
    status, body = raw_get(server.port, target)
    assert status in (400, 403, 404), (target, status)
    assert b"top secret" not in body and b"root:" not in body


@pytest.mark.parametrize("target", ["/../escaped.txt", "/%2e%2e/escaped.txt", "/dir-out/escaped.txt",
                                    "/link-out.txt", "/a%00b"])
def test_put_escape_refused(server, tree, target):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall((f"PUT {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                      "Content-Length: 4\r\nConnection: close\r\n\r\nevil").encode())
        status = int(sock.recv(4096).split(b" ", 2)[1])
    assert status in (400, 403, 404), (target, status)
    outside = tree.parent / "outside"
    assert not (tree.parent / "escaped.txt").exists() and not (outside / "escaped.txt").exists()
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_symlink_inside_root_is_served(server):
    assert requests.get(server.url + "/link-in.txt").text == "hello world\n"


def test_cli_process(tmp_path):
    """``elastic-ctr fileserver`` as a process: serves, takes an upload, stops on SIGTERM."""
    from runtime import bound_ports

    env = dict(os.environ, ELASTIC_CTR_UPLOAD_TOKEN=TOKEN)
    ports = tmp_path / "ports.json"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "fileserver", "--root", str(tmp_path / "r"),
                             "--host", "127.0.0.1", "--port", "0", "--port-file", str(ports)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while bound_ports.read(ports) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
        port = bound_ports.read(ports)["http"]
        src = tmp_path / "x"
        src.write_bytes(b"data")
        storage_write.upload(src, f"http://127.0.0.1:{port}/a/x", token=TOKEN)
        assert (tmp_path / "r" / "a" / "x").read_bytes() == b"data"
    finally:
        proc.terminate()
        t0 = time.monotonic()
        proc.wait(10)
    assert proc.returncode == 0 and time.monotonic() - t0 < 5
