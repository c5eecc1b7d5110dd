"""Hourly partitions (runtime.formats.partitions): hour parsing, the done marker, listing a
partition locally and through the file server's JSON listing."""
from __future__ import annotations

import pytest

from runtime import storage
from runtime.fileserver.app import create_app
from runtime.formats import partitions
from runtime.formats.partitions import Hour, PartitionError
from runtime.web.wsgi import WebServer


def test_hour_parse_format_next():
    h = Hour.parse("20261120/23")
    assert str(h) == "20261120/23"
    assert str(h.next()) == "20261121/00"
    assert [str(x) for x in partitions.hours(h, h.next(2))] == ["20261120/23", "20261121/00", "20261121/01"]
    assert partitions.hours(h.next(), h) == []
    assert h.location("/data") == "/data/20261120/23"


@pytest.mark.parametrize("text", ["2026112000", "20261120/24", "20261340/01", "x/01", ""])
def test_bad_hours_are_named(text):
    with pytest.raises(PartitionError, match="--start-hour"):
        Hour.parse(text, "--start-hour")


def _partition(root, hour: str, names=("part-00000", "part-00001"), done=True):
    d = root / hour.replace("/", "/")
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_text(n)
    (d / ".hidden").write_text("x")
    if done:
        partitions.mark_complete(d)
    return d


def test_complete_partition_lists_data_files(tmp_path):
    _partition(tmp_path, "20261120/00")
    h = Hour.parse("20261120/00")
    assert partitions.is_complete(str(tmp_path), h)
    assert partitions.files(str(tmp_path), h) == [str(tmp_path / "20261120/00/part-00000"),
                                                  str(tmp_path / "20261120/00/part-00001")]


def test_incomplete_or_empty_partitions_are_refused(tmp_path):
    _partition(tmp_path, "20261120/00", done=False)
    _partition(tmp_path, "20261120/01", names=())
    with pytest.raises(PartitionError, match="not complete"):
        partitions.files(str(tmp_path), Hour.parse("20261120/00"))
    with pytest.raises(PartitionError, match="holds no data file"):
        partitions.files(str(tmp_path), Hour.parse("20261120/01"))
    assert not partitions.is_complete(str(tmp_path), Hour.parse("20261120/02"))


def test_partitions_through_the_file_server(tmp_path):
    _partition(tmp_path, "20261120/00")
    _partition(tmp_path, "20261120/01", done=False)
    with WebServer(create_app(tmp_path)) as s:
        root = f"http://127.0.0.1:{s.port}"
        h0, h1 = Hour.parse("20261120/00"), Hour.parse("20261120/01")
        assert partitions.is_complete(root, h0) and not partitions.is_complete(root, h1)
        files = partitions.files(root, h0)
        assert files == [f"{root}/20261120/00/part-00000", f"{root}/20261120/00/part-00001"]
        assert storage.read_bytes(files[1]) == b"part-00001"
        with pytest.raises(storage.LocationError, match="HTTP 404"):
            storage.list_dir(f"{root}/20261120/07")


def test_minute_partitions_round_trip_and_order():
    p = partitions.Partition.parse("20261120/2358", minutes=1)
    assert (str(p), p.minutes, p.seconds) == ("20261120/2358", 1, 60)
    assert [str(x) for x in partitions.span(p, p.next(3))] == ["20261120/2358", "20261120/2359",
                                                               "20261121/0000", "20261121/0001"]
    assert p.location("s3://b/data") == "s3://b/data/20261120/2358"
    assert partitions.Partition.parse(str(p.next(2)), minutes=1) == p.next(2)
    # names sort like their starts, and the hour form names the hour's first minute
    names = [str(p.next(i)) for i in range(130)]
    assert sorted(names) == names
    assert partitions.Partition.parse("20261121/00", minutes=1) == p.next(2)
    five = partitions.Partition.parse("20261120/0055", minutes=5)
    assert [str(five.next(i)) for i in range(3)] == ["20261120/0055", "20261120/0100", "20261120/0105"]
    assert partitions.Partition.parse("20261120/02", minutes=120).next().start.hour == 4
    assert partitions.layout(60) == "YYYYMMDD/HH" and partitions.layout(15) == "YYYYMMDD/HHMM"


@pytest.mark.parametrize("text,minutes,match", [
    ("20261120/0003", 5, "not on a 5-minute boundary"),
    ("20261120/0000", 60, "expected YYYYMMDD/HH"),
    ("20261120/0060", 1, "not a real date"),
    ("20261120/01", 120, "not on a 120-minute boundary"),
    ("20261120/00", 7, "period 7"),
    ("20261120/00", 90, "period 90"),
])
def test_bad_minute_partitions_are_named(text, minutes, match):
    with pytest.raises(PartitionError, match=match):
        partitions.Partition.parse(text, "--start-hour", minutes=minutes)


def test_minute_partition_through_the_file_server(tmp_path):
    _partition(tmp_path, "20261120/0001")
    _partition(tmp_path, "20261120/0002", done=False)
    with WebServer(create_app(tmp_path)) as s:
        root = f"http://127.0.0.1:{s.port}"
        p1 = partitions.Partition.parse("20261120/0001", minutes=1)
        assert partitions.is_complete(root, p1) and not partitions.is_complete(root, p1.next())
        assert partitions.files(root, p1) == [f"{root}/20261120/0001/part-00000", f"{root}/20261120/0001/part-00001"]
