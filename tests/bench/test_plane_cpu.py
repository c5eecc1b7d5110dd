"""bench/plane_cpu.py (make bench-serving-peers' data-plane share and ceiling): the totals a
worker writes are the ones the benchmark reads, per-round differences, and the machine
ratio."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "plane_cpu.py"
_spec = importlib.util.spec_from_file_location("plane_cpu", _PATH)
plane_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plane_cpu)


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_reader_reads_what_a_clock_writes_every_n_calls(tmp_path):
    clock = plane_cpu.PlaneClock(tmp_path, every=3, pid=41)
    for _ in range(2):
        clock.stop(clock.start())
    assert plane_cpu.read_totals(tmp_path) == {}  # nothing written before the 3rd call
    t0 = clock.start()
    _burn(0.02)
    clock.stop(t0)
    totals = plane_cpu.read_totals(tmp_path)
    assert list(totals) == ["plane-41"]
    calls, cpu_s = totals["plane-41"]
    assert calls == 3 and cpu_s == pytest.approx(clock.cpu_s, abs=1e-9)
    assert 0.02 <= cpu_s < 0.5
    assert not list(tmp_path.glob(".*"))  # the temporary file was renamed into place


def test_a_clock_counts_only_its_own_threads_cpu(tmp_path):
    """A call that waits (sleeps) costs no CPU; another thread's work is not counted."""
    clock = plane_cpu.PlaneClock(tmp_path, every=1, pid=1)
    other = threading.Thread(target=_burn, args=(0.1,))
    t0 = clock.start()
    other.start()
    time.sleep(0.1)
    other.join()
    clock.stop(t0)
    assert plane_cpu.read_totals(tmp_path)["plane-1"][1] < 0.03


def test_per_call_ms_between_readings_over_workers():
    before = {"plane-1": (10, 0.010), "plane-2": (5, 0.005)}
    after = {"plane-1": (30, 0.030), "plane-2": (25, 0.045), "plane-3": (10, 0.010)}  # plane-3 started since
    # (0.020 + 0.040 + 0.010) s over (20 + 20 + 10) calls
    assert plane_cpu.plane_ms(before, after) == pytest.approx(70 / 50)
    assert plane_cpu.plane_ms(after, after) is None


@pytest.mark.parametrize("text", ["12\n", "12 0.5", "x 0.5\n", "12 0.5 7\n", ""])
def test_a_malformed_totals_file_is_named(tmp_path, text):
    (tmp_path / "plane-9").write_text(text)
    with pytest.raises(ValueError, match="plane-9"):
        plane_cpu.read_totals(tmp_path)


def test_machine_ratio_and_its_errors():
    peer = (1.8, 0.15, 0.05)  # 2.0 ms of machine CPU per request
    assert plane_cpu.machine_ratio(peer, (0.7, 0.1, 0.0)) == pytest.approx(2.5)
    assert plane_cpu.machine_ratio(peer, (0.4, 0.1, 0.0)) == pytest.approx(4.0)
    with pytest.raises(ValueError, match=r"other\[0\]=-0.1"):
        plane_cpu.machine_ratio(peer, (-0.1, 0.1, 0.0))
    with pytest.raises(ValueError, match=r"peer\[1\]=nan"):
        plane_cpu.machine_ratio((1.0, float("nan"), 0.0), (0.5, 0.1, 0.0))
    with pytest.raises(ValueError, match="adds up to 0"):
        plane_cpu.machine_ratio(peer, (0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="at least 1"):
        plane_cpu.PlaneClock(".", every=0)
