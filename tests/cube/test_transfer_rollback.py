"""Rollback and pinning in the transfer (runtime/cube/transfer/rollback.py), on the
in-process cube of tests/cube/transfer_harness.py: a pinned version's chain is laid out
as one base on every replica, nothing newer goes out while it is pinned, the pin
survives a restart unless the flag set it, and lifting it follows the donefiles again."""
from __future__ import annotations

import pytest
from werkzeug.test import Client

from runtime.cube.buildinfo import BuildRecord
from runtime.cube.transfer import rollback
from runtime.cube.transfer.app import create_app
from runtime.formats import donefile
from tests.cube.transfer_harness import DICT, add_version, drain, make_transfer


def _chain(root):
    add_version(root, 10, 10)
    add_version(root, 11, 10, patch=True)
    add_version(root, 12, 10, patch=True)


def test_chain_of():
    b = [donefile.base_record(10), donefile.base_record(20)]
    p = [donefile.patch_record(11, 10), donefile.patch_record(12, 10), donefile.patch_record(21, 20)]
    assert [r.id for r in rollback.chain_of(12, b, p)] == [10, 11, 12]
    assert [r.id for r in rollback.chain_of(11, b, p)] == [10, 11]
    assert [r.id for r in rollback.chain_of(20, b, p)] == [20]
    with pytest.raises(rollback.RollbackError, match="version 13 is in neither donefile"):
        rollback.chain_of(13, b, p)
    with pytest.raises(rollback.RollbackError, match="base 30, which is not in the base donefile"):
        rollback.chain_of(31, b, p + [donefile.patch_record(31, 30)])


def test_rollback_pin_and_follow_again(cluster, root, tmp_path):
    _chain(root)
    tr = make_transfer(cluster, root, tmp_path / "work")
    drain(tr)
    assert cluster.versions() == [12] * 4
    api = Client(create_app(tr))
    r = api.post("/rollback", json={"version": 11})
    assert r.status_code == 202 and r.json == {"pinned": 11, "served": 12}
    during = []
    tr.agents.barrier, barrier = (lambda *a, **k: (during.append(tr.info()), barrier(*a, **k))[1]), tr.agents.barrier
    (entry,) = drain(tr)
    tr.agents.barrier = barrier
    assert [(i.status, i.version, i.rollout.version, i.rollout.phase, i.rollout.reason) for i in during] == [
        ("rolling_out", 12, 11, p, "rollback to 11") for p in ("Downloading", "Reloading", "Enabling")]
    assert entry["status"] == "finished" and entry["reason"] == "rollback to 11", entry
    assert cluster.versions() == [11] * 4
    info = tr.info()
    assert info.version == 11 and info.pinned == 11 and info.base_id == 10 and info.patch_id == 11
    # the chain went out as one base built from the base's and the patch's files, last wins
    rec = BuildRecord.read(tmp_path / "work" / "build" / "chains" / DICT / "11")
    assert rec.mode == "base" and [p.split("versions/")[1] for p in rec.inputs] == [
        "10/sparse/part-00000", "11/sparse/part-00000"]
    add_version(root, 13, 10, patch=True)  # pinned: nothing newer goes out
    assert drain(tr) == [] and cluster.versions() == [11] * 4
    # the pin survives a restart (set through the API)
    tr2 = make_transfer(cluster, root, tmp_path / "work")
    assert tr2.state.pin.version == 11 and drain(tr2) == []
    r = Client(create_app(tr2)).post("/rollback", json={"version": None})
    assert r.status_code == 202 and r.json["pinned"] is None
    # two patches wait (12, 13): the newest one's chain goes out as one base (one switch)
    (entry,) = drain(tr2)
    assert (entry["status"], entry["version"], entry["reason"]) == ("finished", 13, "catch up to 13"), entry
    assert cluster.versions() == [13] * 4 and tr2.info().base_id == 10
    add_version(root, 14, 10, patch=True)  # then the donefiles are followed: 14 applies on 13
    (entry,) = drain(tr2)
    assert (entry["status"], entry["version"], entry["base_version"]) == ("finished", 14, 13), entry
    assert cluster.versions() == [14] * 4


def test_one_waiting_patch_goes_out_as_usual_after_the_pin(cluster, root, tmp_path):
    _chain(root)
    tr = make_transfer(cluster, root, tmp_path / "work", pin_version=11)
    drain(tr)
    assert cluster.versions() == [11] * 4
    rollback.set_pin(tr, None)
    (entry,) = drain(tr)
    assert (entry["version"], entry["mode"], entry["base_version"]) == (12, "delta", 11), entry


def test_flag_pin_and_bad_requests(cluster, root, tmp_path):
    _chain(root)
    tr = make_transfer(cluster, root, tmp_path / "work", pin_version=10)
    drain(tr)
    assert cluster.versions() == [10] * 4 and tr.info().pinned == 10
    api = Client(create_app(tr))
    assert api.post("/rollback", json={"version": 99}).status_code == 400
    assert "neither donefile" in api.post("/rollback", json={"version": 99}).json["error"]
    assert api.post("/rollback", json={"v": 1}).status_code == 400
    assert api.post("/rollback", json={"version": "x"}).status_code == 400
    tr2 = make_transfer(cluster, root, tmp_path / "work")  # the flag left out: its pin is lifted
    assert tr2.state.pin is None
    assert [e.get("reason") for e in drain(tr2)] == ["catch up to 12"]
    assert cluster.versions() == [12] * 4


def test_rollback_to_a_damaged_chain_fails_and_keeps_serving(cluster, root, tmp_path):
    _chain(root)
    tr = make_transfer(cluster, root, tmp_path / "work")
    drain(tr)
    (root / "versions" / "11" / "sparse" / "part-00000").unlink()
    (root / "versions" / "11" / "sparse" / "_SUCCESS").unlink()
    rollback.set_pin(tr, 11)
    (entry,) = drain(tr)
    assert entry["status"] == "failed" and "version 11" in entry["error"], entry
    assert cluster.versions() == [12] * 4 and tr.info().version == 12
    assert drain(tr) == []  # retried after its backoff, not at once


def test_rollback_command(cluster, root, tmp_path, capsys, monkeypatch):
    """``elastic-ctr rollback``: refused without the cube-control credential (401, nothing
    pinned), refused (exit 1) naming why, unreachable (exit 2), a pin served (exit 0,
    waiting while the transfer's loop lays it out), the pin lifted."""
    import threading

    from runtime import auth, role_specs
    from tests.helpers import ThreadedApp

    creds = auth.write_credentials(tmp_path / "credentials", [role_specs.CUBE_CONTROL])
    _chain(root)
    tr = make_transfer(cluster, root, tmp_path / "work")
    drain(tr)
    app = ThreadedApp(create_app(tr, auth.control_guard("cube-transfer", False, directory=creds)))
    loop = threading.Thread(target=tr.run, daemon=True)
    loop.start()
    try:
        monkeypatch.setenv(role_specs.CREDENTIALS_DIR_ENV, str(tmp_path / "none"))
        assert rollback.request_rollback(app.url, 11, wait_s=1) == 2  # the credential missing: bad input
        err = capsys.readouterr().err
        assert "refused: HTTP 401" in err and "cube-control credential is read from" in err
        assert tr.info().pinned is None
        monkeypatch.setenv(role_specs.CREDENTIALS_DIR_ENV, str(creds))
        assert rollback.request_rollback(app.url, 99, wait_s=5) == 1
        assert "refused: HTTP 400: version 99 is in neither donefile" in capsys.readouterr().err
        assert rollback.request_rollback("http://127.0.0.1:9", 11, wait_s=1) == 2
        assert rollback.request_rollback(app.url, 11, wait_s=30, poll_s=0.05) == 0
        assert "version 11 is served" in capsys.readouterr().out
        assert cluster.versions() == [11] * 4
        assert rollback.request_rollback(app.url, None) == 0
        assert "pin lifted" in capsys.readouterr().out
    finally:
        tr.stop.set()
        loop.join(timeout=10)
        app.close()
