"""A thread's wait budget (``runtime.bounded``): what is left of it, per thread, and the
scope it holds for."""
from __future__ import annotations

import threading
import time

from runtime import bounded


def test_budget_is_the_calling_threads_and_ends_with_its_scope():
    assert bounded.remaining_s() is None and not bounded.bounded()
    seen = {}
    with bounded.budget(0.2):
        first = bounded.remaining_s()
        assert 0.15 < first <= 0.2 and bounded.bounded()
        t = threading.Thread(target=lambda: seen.update(other=bounded.remaining_s()))
        t.start()
        t.join()
        time.sleep(0.05)
        assert bounded.remaining_s() <= first - 0.04  # it runs down
        with bounded.budget(1.0):
            assert bounded.remaining_s() > 0.9
        assert bounded.remaining_s() <= first  # the outer one again
        time.sleep(0.2)
        assert bounded.remaining_s() == 0.0  # spent, not negative
    assert seen == {"other": None}  # another thread has none
    assert bounded.remaining_s() is None and not bounded.bounded()


def test_would_block_passes_the_handlers_of_errors():
    """``except Exception`` (a request's error handler) lets it through to the code that
    set the budget."""
    caught = None
    try:
        try:
            raise bounded.WouldBlock("late")
        except Exception:  # noqa: BLE001 - what the test is about
            caught = "handler"
    except bounded.WouldBlock:
        caught = "budget"
    assert caught == "budget"
