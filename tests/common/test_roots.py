"""runtime/roots.py: a data or model root that cannot be used is refused before any
process starts (a local path, the file server's URL, an S3 bucket), and the trainer's
CLI refuses a missing model bucket before training starts."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime import storage
from runtime.fileserver.app import create_app
from runtime.roots import check_root
from tests.helpers import ThreadedApp


def test_local_path(tmp_path):
    check_root(str(tmp_path / "new" / "root"), "--output", write=True)
    assert (tmp_path / "new" / "root").is_dir() and not list((tmp_path / "new" / "root").iterdir())
    with pytest.raises(storage.LocationNotFound, match="--data-root .*/nope: no such directory"):
        check_root(str(tmp_path / "nope"), "--data-root")
    (tmp_path / "file").write_text("x")
    with pytest.raises(storage.LocationError, match="--output .*/file/sub: cannot write in it"):
        check_root(str(tmp_path / "file" / "sub"), "--output", write=True)


def test_file_server_url(tmp_path):
    app = ThreadedApp(create_app(tmp_path / "served", token="secret"))
    try:
        check_root(app.url + "/models", "--output", write=True, token="secret")
        with pytest.raises(storage.LocationError, match=r"--output .*: cannot write in it: HTTP 40[13] \(check"):
            check_root(app.url + "/models", "--output", write=True, token="wrong")
        check_root(app.url + "/models", "--data-root")
    finally:
        app.close()
    with pytest.raises(storage.LocationError, match="--output http://127.0.0.1:9/m: unreachable"):
        check_root("http://127.0.0.1:9/m", "--output", write=True)


def test_object_store(s3_bucket):
    check_root(f"{s3_bucket}/models", "--output", write=True)
    check_root(f"{s3_bucket}/hours", "--data-root")
    assert storage.expand(f"{s3_bucket}/models/") == []  # the probe object is gone
    with pytest.raises(storage.LocationNotFound, match="--output s3://no-such-bucket-y/m: no such bucket"):
        check_root("s3://no-such-bucket-y/m", "--output", write=True)


def test_trainer_refuses_a_missing_model_bucket_before_training(s3_bucket, tmp_path):
    data = tmp_path / "train.txt"
    data.write_text("0" + "\t" * 39 + "\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "train", "--single", "--data-train", str(data),
                        "--output", "s3://no-such-model-bucket/versions"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "--output s3://no-such-model-bucket/versions: no such bucket" in r.stderr
    assert "Segmentation" not in r.stderr and "Traceback" not in r.stderr and "C++" not in r.stderr
