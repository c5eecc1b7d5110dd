"""runtime/formats/manifest.py: the manifest the export writes is what readers verify; a
SequenceFile cut exactly between two records is noticed through the manifest's rows."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.formats import manifest
from runtime.formats.seqfile import SequenceFileError, SequenceFileReader, read_sequence_file
from runtime.formats.seqfile_writer import write_sequence_file

SYNC = b"fedcba9876543210"


def _version(tmp_path, rows=300):
    v = tmp_path / "v"
    (v / "sparse").mkdir(parents=True)
    (v / "dense").mkdir()
    rng = np.random.default_rng(0)
    keys = np.arange(rows, dtype=np.uint64)
    write_sequence_file(v / "sparse" / "part-00000", keys, rng.standard_normal((rows, 3)).astype(np.float32), sync=SYNC)
    (v / "dense" / "inference.pdiparams").write_bytes(b"p" * 100)
    return v


def test_build_write_read_verify_round_trip(tmp_path):
    v = _version(tmp_path)
    m = manifest.build(v, 7)
    assert [(f.path, f.rows) for f in m.files] == [("dense/inference.pdiparams", None), ("sparse/part-00000", 300)]
    (v / manifest.FILE).write_text(m.to_json())
    back = manifest.read(str(v.parent), f"v/{manifest.FILE}", 7)
    assert back == m
    for f in back.files:
        manifest.verify_file(f, v / f.path, f.path)
    with pytest.raises(manifest.ManifestError, match="version 7, expected 8"):
        manifest.read(str(v.parent), f"v/{manifest.FILE}", 8)


def test_reader_notices_a_file_cut_between_two_records(tmp_path):
    v = _version(tmp_path)
    part = v / "sparse" / "part-00000"
    keys, values = read_sequence_file(part)
    short = tmp_path / "short"
    write_sequence_file(short, keys[:120], values[:120], sync=SYNC)
    cut = short.read_bytes()
    assert part.read_bytes().startswith(cut)  # a byte prefix ending on a record boundary
    part.write_bytes(cut)
    assert len(read_sequence_file(part)[0]) == 120  # a well-formed file on its own
    with pytest.raises(SequenceFileError, match="ends after 120 records, 300 expected"):
        with SequenceFileReader(part, expect_rows=300) as r:
            list(r.iter_batches())
    with pytest.raises(SequenceFileError, match="more records than the 100 expected"):
        with SequenceFileReader(part, expect_rows=100) as r:
            list(r.iter_batches())


@pytest.mark.parametrize("doc,why", [
    (b"{", "not a JSON manifest"),
    (b'{"format": "other", "version": 1, "files": []}', "format"),
    (b'{"version": 1, "files": [{"path": "../x", "bytes": 1, "sha256": "' + b"0" * 64 + b'"}]}', "relative path"),
    (b'{"version": 1, "files": [{"path": "x", "bytes": 1, "sha256": "abc"}]}', "sha256"),
])
def test_malformed_manifest_is_named(tmp_path, doc, why):
    (tmp_path / manifest.FILE).write_bytes(doc)
    with pytest.raises(manifest.ManifestError, match=why):
        manifest.read(str(tmp_path), manifest.FILE)


def test_missing_manifest_and_missing_file(tmp_path):
    with pytest.raises(manifest.ManifestMismatch, match="manifest missing"):
        manifest.read(str(tmp_path), manifest.FILE)
    e = manifest.FileEntry(path="dense/x", bytes=3, sha256="0" * 64)
    with pytest.raises(manifest.ManifestMismatch, match="dense/x: missing"):
        manifest.verify_file(e, tmp_path / "nope", "dense/x")
