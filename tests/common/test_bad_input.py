"""Bad input and an environment that is not ready, as a user meets them on the command line
(``runtime.errors``): each is one line on stderr naming the flag or location and the cause,
with exit code 2, never a traceback, retry chatter or the wrong cause; a subcommand's usage
error shows that subcommand's usage; every subcommand has a description."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import errors, proc

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``elastic-ctr ARGV`` as a user runs it (the console script's module), in the repository."""
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The one line ``r`` printed on stderr (asserting there is exactly one, and no traceback)."""
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert "Traceback" not in r.stderr and "Retrying" not in r.stderr, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def test_schema_check_with_a_missing_schema_names_the_flag(tmp_path):
    r = run("schema", "check", "--data-root", str(tmp_path), "--start-hour", "20260101/00",
            "--end-hour", "20260101/01", "--schema", str(tmp_path / "missing.yaml"))
    assert r.returncode == errors.BAD_INPUT  # not 1: that is "a partition breaks the schema"
    line = one_error_line(r)
    assert line == f"elastic-ctr schema check: error: --schema {tmp_path}/missing.yaml: No such file or directory"


def test_a_bad_start_hour_is_one_line():
    r = run("schema", "check", "--data-root", "/nonexistent", "--start-hour", "2026/00", "--end-hour",
            "20260101/01", "--schema", str(ROOT / "schemas" / "ctr.yaml"))
    assert r.returncode == 2
    assert one_error_line(r) == ("elastic-ctr schema check: error: --start-hour '2026/00': expected YYYYMMDD/HH, "
                                 "e.g. 20261120/00")


def test_serve_checks_its_topology_before_it_says_it_serves(tmp_path):
    r = run("serve", "--topology", str(tmp_path / "missing.json"), "--model-root", str(tmp_path))
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_error_line(r)
    assert line.startswith(f"elastic-ctr serve: error: --topology {tmp_path}/missing.json: cannot read the topology")
    assert "serving on" not in r.stdout + r.stderr
    (tmp_path / "t.json").write_text("{}")
    r = run("serve", "--topology", str(tmp_path / "t.json"), "--model-root", str(tmp_path))
    assert r.returncode == 2 and "--topology" in one_error_line(r) and "invalid topology" in r.stderr


def test_serve_checks_its_model_root(tmp_path):
    from runtime.formats.topology import Topology

    topo = tmp_path / "topology.json"
    topo.write_text(Topology.parse({"dict_name": "d", "shards": [
        {"shard": 0, "replicas": [{"server": "127.0.0.1:9", "http": "http://127.0.0.1:9", "agent": "http://127.0.0.1:9"}]}]})
        .to_json())
    r = run("serve", "--topology", str(topo), "--model-root", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert one_error_line(r) == f"elastic-ctr serve: error: --model-root {tmp_path}/nope: no such directory"
    r = run("serve", "--topology", str(topo), "--model-root", "http:///versions")
    assert r.returncode == 2 and one_error_line(r).endswith("--model-root http:///versions: a URL without a host")


def test_rollback_to_a_transfer_that_is_not_there_is_one_line_without_retry_chatter():
    port = proc.free_port()
    r = run("rollback", "--to", "5", "--transfer-url", f"http://127.0.0.1:{port}")
    assert r.returncode == 2
    assert one_error_line(r) == (f"elastic-ctr rollback: error: --transfer-url http://127.0.0.1:{port}: unreachable "
                                 "(connection refused); on a cluster, port-forward the transfer first (docs: "
                                 "Rollback on a cluster)")


def test_an_unknown_flag_shows_the_subcommands_usage():
    r = run("render", "--stack", "dev", "--bogus")
    assert r.returncode == 2
    assert r.stderr.startswith("usage: elastic-ctr render ")
    assert r.stderr.rstrip().splitlines()[-1] == "elastic-ctr render: error: unrecognized arguments: --bogus"
    r = run("cube", "server", "--shard", "0", "--bogus")  # a nested subcommand: its own usage
    assert r.returncode == 2 and r.stderr.startswith("usage: elastic-ctr cube server ")


def test_log_level_takes_its_choices():
    r = run("--log-level", "verbose", "render", "--stack", "dev")
    assert r.returncode == 2
    assert "argument --log-level: invalid choice: 'VERBOSE' (choose from 'DEBUG', 'INFO', 'WARNING'" in r.stderr
    r = run("render", "--stack", "dev", env={"ELASTIC_CTR_LOG_LEVEL": "loud"})
    assert r.returncode == 2 and "$ELASTIC_CTR_LOG_LEVEL 'LOUD': expected one of DEBUG, INFO" in r.stderr
    from runtime.cli import build_parser

    assert build_parser("render").parse_args(["--log-level", "debug", "render", "--stack", "dev"]).log_level == "DEBUG"


def test_every_subcommand_has_a_description():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hook", ROOT / "docs/hooks/reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    from runtime.cli import build_parser

    assert [p.prog for p, _ in hook.subcommands(build_parser()) if not p.description] == []


def test_input_errors_are_recognised_by_name_along_the_mro():
    from runtime import storage
    from runtime.formats.partitions import PartitionError

    assert errors.is_input_error(storage.LocationNotFound("x")) and errors.is_input_error(PartitionError("x"))
    assert errors.is_input_error(errors.InputError("x"))
    assert not errors.is_input_error(ValueError("x")) and not errors.is_input_error(RuntimeError("x"))
    for name in errors.INPUT_ERRORS:  # every name is a class that exists
        module, cls = name.rsplit(".", 1)
        assert isinstance(getattr(__import__(module, fromlist=[cls]), cls), type), name


def test_a_defect_keeps_its_traceback(monkeypatch):
    """Only the input errors become a line: anything else is raised, traceback and all."""
    from infra import render
    from runtime import cli

    def boom(*args, **kwargs):
        raise RuntimeError("a defect")

    monkeypatch.setattr(render, "render", boom)
    with pytest.raises(RuntimeError, match="a defect"):
        cli.main(["render", "--stack", "dev"])


# ------------------------------------------------------------------ object stores
@pytest.fixture(scope="module")
def s3_auth(tmp_path_factory):
    """An S3 server that checks signatures and keys (moto after 4 unauthenticated
    requests), a bucket ``ctr-auth`` on it and a key pair allowed everything: yields the
    environment of a client with those keys."""
    import boto3

    from tests.s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3auth"), server_env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as s3:
        kw = dict(endpoint_url=s3.endpoint, aws_access_key_id="setup", aws_secret_access_key="setup",
                  region_name="us-east-1")
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="ctr")
        iam.put_user_policy(UserName="ctr", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="ctr")["AccessKey"]
        boto3.client("s3", **kw).create_bucket(Bucket="ctr-auth")
        yield {**s3.env(), "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def _train_output(tmp_path: Path, output: str, env: dict) -> subprocess.CompletedProcess:
    data = tmp_path / "train.txt"
    data.write_text("0" + "\t" * 39 + "\n")
    return run("train", "--single", "--data-train", str(data), "--output", output, env=env)


def test_store_errors_name_the_cause(s3_auth, tmp_path):
    """The roots check tells a missing bucket, wrong credentials (naming where they came
    from, never a secret), and an endpoint that is down apart."""
    good = _train_output(tmp_path, "s3://no-such-bucket-z/versions", s3_auth)
    assert good.returncode == 2
    assert one_error_line(good) == ("elastic-ctr train: error: --output s3://no-such-bucket-z/versions: no such "
                                    "bucket 'no-such-bucket-z'")
    wrong = {**s3_auth, "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}
    r = _train_output(tmp_path, "s3://ctr-auth/versions", wrong)
    assert r.returncode == 2
    line = one_error_line(r)
    assert line.startswith("elastic-ctr train: error: --output s3://ctr-auth/versions: access denied: check the "
                           "credentials"), line
    key_id = s3_auth["AWS_ACCESS_KEY_ID"]
    assert f"credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from the environment, key id ...{key_id[-4:]}" in line
    assert "no such bucket" not in line and "wrong-secret-value" not in r.stderr + r.stdout
    down = {**s3_auth, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{proc.free_port()}"}
    r = _train_output(tmp_path, "s3://ctr-auth/versions", down)
    assert r.returncode == 2
    line = one_error_line(r)
    assert line.startswith("elastic-ctr train: error: --output s3://ctr-auth/versions: endpoint unreachable after "
                           "5 attempts (Could not connect to the endpoint URL"), line
