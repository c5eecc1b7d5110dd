"""The demo's chart (runtime.local.plot): a PNG with the series given; mismatched series are
an error naming the one that does not fit."""
from __future__ import annotations

import pytest

from runtime.local import plot


def test_chart_is_a_png(tmp_path):
    out = plot.write_chart(tmp_path / plot.CHART, ["20261120/01", "20261120/02"], [0.8, None], [0.79, 0.85],
                           [0.79, 0.78], [0.9, 0.91], [11, 12], ["base", "patch"], [0.8, 0.4])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_mismatched_series_are_named(tmp_path):
    with pytest.raises(ValueError, match="rollout_s has 1 entries, hours has 2"):
        plot.write_chart(tmp_path / "x.png", ["a", "b"], [None, None], [0.5, 0.5], [0.5, 0.5], [0.9, 0.9], [1, 2],
                         ["base", "patch"], [0.1])
