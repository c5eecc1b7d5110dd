"""Donefile lines: the writer's records read back exactly; malformed lines named and skipped."""
from __future__ import annotations

import json

import pytest

from runtime.formats import donefile


def test_parse_skips_malformed_lines_and_names_them():
    text = "\n".join([
        '{"id": 1, "key": 1, "input": "versions/1/sparse"}',
        'not json',
        '[1, 2]',
        '{"id": 2, "key": 2}',
        '{"id": "x", "key": 2, "input": "a"}',
        '{"id": true, "key": 2, "input": "a"}',
        '{"id": -3, "key": 2, "input": "a"}',
        '{"id": 4, "key": 4, "input": ""}',
        '',
        '{"id": "5", "key": 5, "input": "versions/5/sparse", "dim": 8}',
        '{"id": 6, "key": 6, "inp',  # a half-written last line
        '{"id": 7, "key": 7, "input": "a", "extra": 1}',
    ])
    recs, errors = donefile.parse(text)
    assert [(r.id, r.key, r.line) for r in recs] == [(1, 1, 1), (5, 5, 10)]
    assert recs[1].dim == 8
    assert [n for n, _, _ in errors] == [2, 3, 4, 5, 6, 7, 8, 11, 12]
    why = dict((n, w) for n, w, _ in errors)
    assert "input: Field required" in why[4]
    assert "boolean" in why[6] and "greater than or equal to 0" in why[7]
    assert "extra: Extra inputs are not permitted" in why[12]


def test_written_lines_read_back_exactly(tmp_path):
    root = str(tmp_path)
    base = donefile.base_record(100, dim=9, count=5)
    patch = donefile.patch_record(101, base=100, dim=9, count=2)
    donefile.append(root, "base", base)
    donefile.append(root, "patch", patch)
    (b,), (p,) = donefile.read(root, "base"), donefile.read(root, "patch")
    assert (b.to_line(), b.line) == (base.to_line(), 1) and p.to_line() == patch.to_line()
    assert json.loads((tmp_path / "donefile" / "patch.txt").read_text()) == {
        "id": 101, "key": 100, "input": "versions/101/sparse", "model": "versions/101/dense", "dim": 9, "count": 2}
    assert donefile.newest_id(root) == 101
    assert donefile.new_version_id(root, now_s=50) == 102  # ids increase even when the clock does not
    assert donefile.new_version_id(root, now_s=5000) == 5000
    assert donefile.read(str(tmp_path / "missing"), "base") == []


def test_bad_kind():
    with pytest.raises(ValueError, match="base or patch"):
        donefile.location("/r", "delta")


def test_lines_appended_after_malformed_ones_are_read(tmp_path):
    """A malformed line in the middle (hand-edited, half-written) is skipped; the lines
    appended after it are read, in file order."""
    root = str(tmp_path)
    donefile.append(root, "base", donefile.base_record(1, dim=4, count=2))
    with open(tmp_path / "donefile" / "base.txt", "a") as f:
        f.write('not json\n{"id": 2}\n')
    donefile.append(root, "base", donefile.base_record(3, dim=4, count=2))
    assert [(r.id, r.line) for r in donefile.read(root, "base")] == [(1, 1), (3, 4)]
    assert donefile.read(root, "patch") == []

