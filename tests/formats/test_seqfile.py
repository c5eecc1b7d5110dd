"""SequenceFile reader/writer: round trips in every style, Hadoop framing, corruption offsets."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from runtime.formats import seqfile
from runtime.formats.seqfile import SequenceFileError, read_sequence_file
from runtime.formats.seqfile_writer import write_sequence_file


def _data(n=1000, dim=9, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    return keys, rng.standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("style", ["raw", "bytes_writable", "long_writable"])
def test_round_trip_every_style(tmp_path, style):
    keys, vals = _data()
    path = tmp_path / "part-00000"
    nbytes = write_sequence_file(path, keys, vals, style=style)
    assert nbytes == path.stat().st_size
    k2, v2 = read_sequence_file(path)
    np.testing.assert_array_equal(k2, keys)
    np.testing.assert_array_equal(v2, vals)


def test_small_chunks_cross_sync_markers(tmp_path):
    keys, vals = _data(n=5000, dim=3)
    path = tmp_path / "p"
    write_sequence_file(path, keys, vals, sync_interval=100)
    with seqfile.SequenceFileReader(path, chunk_bytes=1) as r:  # clamped to 64 KiB
        r.chunk_bytes = 1000  # force many chunk boundaries inside records and markers
        got = list(r.iter_batches())
    assert len(got) > 10
    np.testing.assert_array_equal(np.concatenate([k for k, _ in got]), keys)
    np.testing.assert_array_equal(np.concatenate([v for _, v in got]), vals)


def test_hadoop_framing_matches_the_reference_layout(tmp_path):
    """Header and first record byte by byte, as Hadoop's SequenceFile.Writer lays them out."""
    path = tmp_path / "p"
    write_sequence_file(path, np.array([7], np.uint64), np.array([[1.0, 2.0]], np.float32),
                        sync=b"S" * 16)
    b = path.read_bytes()
    cls = b"org.apache.hadoop.io.BytesWritable"
    head = b"SEQ\x06" + bytes([len(cls)]) + cls + bytes([len(cls)]) + cls + b"\x00\x00" + b"\x00" * 4 + b"S" * 16
    assert b[: len(head)] == head
    rec = b[len(head):]
    assert struct.unpack(">ii", rec[:8]) == (16, 8)
    assert struct.unpack("<Q", rec[8:16]) == (7,)
    assert struct.unpack("<2f", rec[16:24]) == (1.0, 2.0)


def test_sync_escapes_are_written_and_read(tmp_path):
    keys, vals = _data(n=500, dim=10)
    path = tmp_path / "p"
    write_sequence_file(path, keys, vals, sync=b"\x01" * 16)
    data = path.read_bytes()
    assert data.count(b"\xff\xff\xff\xff" + b"\x01" * 16) == 500 * 56 // 2016  # one per 36 records
    np.testing.assert_array_equal(read_sequence_file(path)[0], keys)


def test_empty_file(tmp_path):
    path = tmp_path / "p"
    write_sequence_file(path, np.empty(0, np.uint64), np.empty((0, 4), np.float32))
    k, v = read_sequence_file(path)
    assert k.shape == (0,) and v.shape[0] == 0


def test_truncated_file_names_file_and_offset(tmp_path):
    keys, vals = _data(n=100, dim=4)
    path = tmp_path / "part-1"
    write_sequence_file(path, keys, vals)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(SequenceFileError) as e:
        read_sequence_file(path)
    assert "part-1" in str(e.value) and "truncated" in str(e.value)
    assert e.value.offset == len(data) - 7 - (32 - 7)  # start of the cut record (32 bytes each)


def test_corrupt_record_length_names_offset(tmp_path):
    keys, vals = _data(n=100, dim=4)
    path = tmp_path / "p"
    write_sequence_file(path, keys, vals, sync_interval=10**9)
    data = bytearray(path.read_bytes())
    hdr = len(data) - 100 * 32
    bad = hdr + 50 * 32
    data[bad: bad + 4] = struct.pack(">i", 999)
    path.write_bytes(bytes(data))
    with pytest.raises(SequenceFileError) as e:
        read_sequence_file(path)
    assert e.value.offset == bad


def test_bad_magic_and_compression(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"PK\x03\x04 not a sequence file")
    with pytest.raises(SequenceFileError, match="SEQ"):
        read_sequence_file(p)
    keys, vals = _data(n=3)
    write_sequence_file(p, keys, vals)
    data = bytearray(p.read_bytes())
    data[4 + 35 * 2] = 1  # the compress flag
    p.write_bytes(bytes(data))
    with pytest.raises(SequenceFileError, match="compressed"):
        read_sequence_file(p)


def test_bad_sync_marker(tmp_path):
    keys, vals = _data(n=200, dim=10)
    p = tmp_path / "p"
    write_sequence_file(p, keys, vals, sync=b"\x02" * 16)
    data = bytearray(p.read_bytes())
    i = data.index(b"\xff\xff\xff\xff" + b"\x02" * 16, 100)
    data[i + 10] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(SequenceFileError):
        read_sequence_file(p)
