"""runtime.storage on an S3-protocol server (moto on loopback, tests/s3server.py): the
same operations as on paths and the file server, and errors naming the location."""
from __future__ import annotations

import sys
import time

import pytest

from runtime import objectstore, storage, storage_write


def test_upload_read_list_expand_download(s3_bucket, tmp_path):
    src = tmp_path / "part-00000"
    src.write_bytes(b"1\t2\n3\t4\n" * 1000)
    root = storage.join(s3_bucket, "data")
    assert root == f"{s3_bucket}/data"
    storage_write.upload(src, storage.join(root, "20261120/00/part-00000"))
    storage_write.upload(src, storage.join(root, "20261120/00/part-00001"))
    loc = storage.join(root, "20261120/00/part-00000")
    assert storage.read_bytes(loc) == src.read_bytes()
    assert list(storage.iter_lines(loc))[:2] == ["1\t2", "3\t4"]
    with storage.open_stream(loc) as f:
        assert f.read(4) == b"1\t2\n"
    assert storage.exists(loc) and not storage.exists(loc + "x")
    assert storage.list_dir(storage.join(root, "20261120")) == [("00", "dir")]
    assert storage.list_dir(storage.join(root, "20261120/00")) == [("part-00000", "file"), ("part-00001", "file")]
    assert storage.expand(storage.join(root, "20261120/00")) == [loc, loc[:-1] + "1"]
    assert storage.expand(storage.join(root, "20261120/00/*1")) == [loc[:-1] + "1"]
    assert storage.is_remote(loc) and storage.is_store(loc) and not storage.is_url(loc)
    got = storage.download(loc, tmp_path / "out" / "p", md5=storage.md5_file(src))
    assert got == storage.md5_file(src) and (tmp_path / "out" / "p").read_bytes() == src.read_bytes()
    with pytest.raises(storage.LocationError, match="md5 mismatch"):
        storage.download(loc, tmp_path / "out" / "q", md5="0" * 32)
    assert not (tmp_path / "out" / "q").exists()


def test_upload_tree_keeps_relative_paths(s3_bucket, tmp_path):
    (tmp_path / "v" / "dense").mkdir(parents=True)
    (tmp_path / "v" / "dense" / "model_meta.json").write_text("{}")
    (tmp_path / "v" / "sparse").mkdir()
    (tmp_path / "v" / "sparse" / "part-0").write_bytes(b"SEQ")
    rels = storage_write.upload_tree(tmp_path / "v", storage.join(s3_bucket, "versions/7"))
    assert rels == ["dense/model_meta.json", "sparse/part-0"]
    assert storage.read_bytes(f"{s3_bucket}/versions/7/sparse/part-0") == b"SEQ"


def test_missing_bucket_and_key_are_named(s3_bucket):
    missing_key = f"{s3_bucket}/no/such/key.txt"
    with pytest.raises(storage.LocationNotFound, match=f"{missing_key}: no such object"):
        storage.read_bytes(missing_key)
    with pytest.raises(storage.LocationNotFound, match="no-such-bucket-x1/k"):
        storage.open_stream("s3://no-such-bucket-x1/k")
    with pytest.raises(storage.LocationError, match="no-such-bucket-x1/d"):
        storage.list_dir("s3://no-such-bucket-x1/d")
    with pytest.raises(storage.LocationError, match="no such object"):
        storage.check_readable(f"{s3_bucket}/nothing/*.txt")
    assert storage.expand(f"{s3_bucket}/nothing/") == []


def test_unreachable_endpoint_fails_within_bounded_retries(s3_bucket, monkeypatch):
    from s3fs import S3FileSystem

    from tests.helpers import refusing_ports

    with refusing_ports(1) as (port,):
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
        S3FileSystem.clear_instance_cache()
        t0 = time.monotonic()
        with pytest.raises(storage.LocationError, match=rf"{s3_bucket}/k: endpoint unreachable after 5 attempts"):
            storage.read_bytes(f"{s3_bucket}/k")
    assert time.monotonic() - t0 < 60


def test_missing_store_package_names_what_to_install(monkeypatch):
    import fsspec  # noqa: F401 - loads fsspec.registry

    registry = sys.modules["fsspec.registry"]._registry  # implementations imported so far
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # "not installed": its import fails
    monkeypatch.setitem(sys.modules, "s3fs", None)
    for proto in ("gs", "gcs", "s3", "s3a"):
        monkeypatch.delitem(registry, proto, raising=False)
    with pytest.raises(storage.LocationError, match=r"gs://b/x: gs:// needs its fsspec implementation: pip install gcsfs"):
        storage.read_bytes("gs://b/x")
    with pytest.raises(storage.LocationError, match=r"s3://b/x: .*pip install 'elastic-ctr\[s3\]'"):
        storage.read_bytes("s3://b/x")


def test_append_line_is_conditional_and_idempotent(s3_bucket, monkeypatch):
    loc = f"{s3_bucket}/donefile/base.txt"
    storage_write.append_line(loc, "a")
    storage_write.append_line(loc, "b\n")
    storage_write.append_line(loc, "a")  # a repeated append (writer restarted) is not duplicated
    assert storage.read_bytes(loc) == b"a\nb\n"
    # a writer that read a stale ETag loses the race once, re-reads, and keeps both lines
    real = objectstore.filesystem

    class Racing:
        def __init__(self):
            self.raced = False

        def __call__(self, location):
            fs, path = real(location)
            if not self.raced:
                self.raced = True
                orig = fs.cat_file

                def cat_then_other_writer(p, *a, **kw):
                    fs.cat_file = orig  # once
                    data = orig(p, *a, **kw)
                    fs.pipe_file(p, data + b"other\n")  # another writer, between read and write
                    return data
                monkeypatch.setattr(fs, "cat_file", cat_then_other_writer)
            return fs, path

    racing = Racing()
    monkeypatch.setattr(objectstore, "filesystem", racing)
    storage_write.append_line(loc, "c")
    monkeypatch.undo()
    assert racing.raced
    assert storage.read_bytes(loc) == b"a\nb\nother\nc\n"


def test_local_root_flags_are_checked(s3_bucket):
    """``elastic-ctr local --data-root/--model-root``: online mode only, the model root
    must be an object-store location (the file server is the default otherwise), and
    both must be there and writable before anything starts."""
    from argparse import Namespace

    from runtime.local.pipeline import _check_roots

    _check_roots(Namespace(mode="online", data=None, data_root=f"{s3_bucket}/hours", model_root=f"{s3_bucket}/model"))
    with pytest.raises(storage.LocationNotFound, match="--model-root s3://no-such-bucket-x/model: no such bucket"):
        _check_roots(Namespace(mode="online", data=None, data_root=None, model_root="s3://no-such-bucket-x/model"))
    with pytest.raises(ValueError, match="--model-root /tmp/m: expected an object-store location"):
        _check_roots(Namespace(mode="online", data=None, data_root=None, model_root="/tmp/m"))
    with pytest.raises(ValueError, match="--data-root s3://b/h: only with --mode online"):
        _check_roots(Namespace(mode="rounds", data=None, data_root="s3://b/h", model_root=None))


def test_wrong_credentials_are_named_and_never_read_as_missing(tmp_path, monkeypatch):
    """A server that checks signatures and IAM keys (moto after its first
    INITIAL_NO_AUTH_ACTION_COUNT requests): the right keys read and write; a wrong secret
    or an unknown key id fails naming the location and the credentials, also for
    ``exists`` (a 403 is never taken for a missing object)."""
    import json

    import boto3
    from s3fs import S3FileSystem

    from tests.s3server import S3Server

    with S3Server(tmp_path, server_env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as s3:
        kw = dict(endpoint_url=s3.endpoint, aws_access_key_id="setup", aws_secret_access_key="setup",
                  region_name="us-east-1")
        iam = boto3.client("iam", **kw)  # the 4 unauthenticated requests: a user, its policy and key, a bucket
        iam.create_user(UserName="ctr")
        iam.put_user_policy(UserName="ctr", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="ctr")["AccessKey"]
        boto3.client("s3", **kw).create_bucket(Bucket="ctr-auth")
        for k, v in {**s3.env(), "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                     "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}.items():
            monkeypatch.setenv(k, v)
        S3FileSystem.clear_instance_cache()
        src = tmp_path / "x.txt"
        src.write_text("hi\n")
        storage_write.upload(src, "s3://ctr-auth/x.txt")
        assert storage.read_bytes("s3://ctr-auth/x.txt") == b"hi\n"
        for name, value in (("AWS_SECRET_ACCESS_KEY", "wrong"), ("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")):
            monkeypatch.setenv(name, value)
            S3FileSystem.clear_instance_cache()
            with pytest.raises(storage.LocationError, match="s3://ctr-auth/x.txt: access denied: check the credentials"):
                storage.read_bytes("s3://ctr-auth/x.txt")
            with pytest.raises(storage.LocationError, match="access denied"):
                storage.exists("s3://ctr-auth/x.txt")
        S3FileSystem.clear_instance_cache()
