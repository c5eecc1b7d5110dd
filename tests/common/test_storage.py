"""Tests of runtime.storage on local paths (HTTP is covered with the file server)."""
from __future__ import annotations


import pytest

from runtime import storage, storage_write


def test_join_paths_and_urls():
    assert storage.join("http://h:1/root", "versions/3/dense") == "http://h:1/root/versions/3/dense"
    assert storage.join("/data/root", "versions", "3") == "/data/root/versions/3"
    assert storage.join("/data/root", "http://other/x") == "http://other/x"


def test_download_verifies_md5_and_leaves_nothing_on_mismatch(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 3000)
    good = storage.md5_file(src)
    assert storage.download(str(src), tmp_path / "out" / "ok.bin", md5=good) == good
    with pytest.raises(storage.LocationError, match="md5 mismatch"):
        storage.download(str(src), tmp_path / "out" / "bad.bin", md5="0" * 32)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ok.bin"]


def test_append_line_adds_whole_lines(tmp_path):
    """append_line creates the file, ends every line with a newline, and completes a last
    line written without one (the donefile's reader: tests/formats/test_donefile.py)."""
    df = tmp_path / "donefile" / "base.txt"
    storage_write.append_line(str(df), "a")
    with open(df, "a") as f:
        f.write("b")
    storage_write.append_line(str(df), "c\n")
    assert df.read_text() == "a\nb\nc\n"


def test_missing_location_is_a_clear_error(tmp_path):
    with pytest.raises(storage.LocationError, match="nope.txt"):
        storage.check_readable(str(tmp_path / "nope.txt"))
    with pytest.raises(storage.LocationError, match="nope.txt"):
        storage.open_stream(str(tmp_path / "nope.txt"))


def test_uploaded_and_downloaded_files_are_not_private(tmp_path):
    """Files put in place through temporary files get the umask's mode, not mkstemp's 0600."""
    import os
    import stat

    src = tmp_path / "a.bin"
    src.write_bytes(b"data")
    old = os.umask(0o022)
    try:
        storage_write.upload(str(src), str(tmp_path / "pub" / "a.bin"))
        storage.download(str(src), tmp_path / "dl" / "a.bin")
    finally:
        os.umask(old)
    for p in (tmp_path / "pub" / "a.bin", tmp_path / "dl" / "a.bin"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
