"""scripts/check-prereqs.sh, what `make install` checks first: one line per missing piece,
naming it and how to get it; nothing installed when a required one is missing; what needs
root or Python 3.11 is optional for `make install` (its tests skip) and required with
--all (`make test`)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-prereqs.sh"


def _bin(tmp: Path, uid: int = 1000, python: str | None = "3.9.18") -> Path:
    """A PATH with the shell tools the script uses, a fake ``id`` (``uid``) and ``python3``
    (reporting ``python`` as its version, or absent); no compiler, sudo, python3.11, apt-get."""
    b = tmp / "bin"
    b.mkdir()
    for tool in ("bash", "df", "awk", "env", "dirname", "cat"):
        os.symlink(shutil.which(tool), b / tool)
    (b / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if python:
        major, minor = (int(x) for x in python.split(".")[:2])
        (b / "python3").write_text(
            "#!/bin/sh\n"
            f'case "$*" in *version_info*) exit {int((major, minor) < (3, 10))};; '
            f"*platform*) echo {python};; *ensurepip*) exit 1;; *sysconfig*) echo {tmp}/include;; esac\n")
    for f in b.iterdir():
        f.chmod(0o755)
    return b


def _run(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(path), "HOME": str(path.parent), "DEB_BIN": str(path.parent / "no-debs")})


def test_each_missing_piece_is_one_line(tmp_path):
    r = _run(_bin(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1
    missing = [l for l in lines if l.startswith("check-prereqs: missing: ")]
    assert any("Python 3.10 or newer: 'python3' is 3.9.18" in l for l in missing), lines
    assert any("venv module with ensurepip" in l and "python3-venv" in l for l in missing), lines
    assert any("C headers" in l and "python3-dev" in l for l in missing), lines
    assert any("a C compiler" in l and "apt-get install gcc" in l for l in missing), lines
    assert lines[-1] == "check-prereqs: 4 missing piece(s): nothing was installed"
    optional = [l for l in lines if l.startswith("check-prereqs: optional: ")]
    assert any("Python 3.11" in l and "skip" in l for l in optional), lines
    assert any("Chromium and chromedriver" in l and "needs root or passwordless sudo" in l for l in optional), lines
    assert any("Prometheus and promtool" in l and "tests/monitoring" in l for l in optional), lines


def test_a_missing_python_is_named(tmp_path):
    r = _run(_bin(tmp_path, python=None))
    assert r.returncode == 1
    assert "check-prereqs: missing: Python 3.10 or newer as 'python3' (set PYTHON=" in r.stderr


def test_with_all_the_optional_pieces_are_required(tmp_path):
    r = _run(_bin(tmp_path), "--all")
    assert r.returncode == 1
    assert "check-prereqs: optional:" not in r.stderr
    assert "check-prereqs: missing: Python 3.11 as 'python3.11'" in r.stderr and "(make test needs it)" in r.stderr


def test_this_machine_passes():
    """The machine the suite runs on has what make install needs (it got here)."""
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": os.environ.get("PYTHON", "python3")})
    assert r.returncode == 0, r.stderr
    assert "missing" not in r.stderr


def test_a_missing_tool_skips_and_fails_under_make_test(tmp_path, monkeypatch):
    import pytest

    from tests import tools

    monkeypatch.delenv(tools.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"Chromium is not installed \(.*/nope\): make browser"):
        tools.need([tmp_path / "nope"], "Chromium", "make browser")
    monkeypatch.setenv(tools.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="make test installs it"):
        tools.need([tmp_path / "nope"], "Chromium", "make browser")
    tools.need([tmp_path], "a directory", "")  # present: nothing happens
