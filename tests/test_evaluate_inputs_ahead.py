"""`judging.InputsAhead`: timing's input sets made before timing starts, each handed out
once, then made on the spot; a maker that fails ahead fails again where it is seen."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from htam_engine.evaluate.judging import InputsAhead
from htam_engine.evaluate.verdict import SETS_AHEAD, sets_ahead


def test_sets_made_ahead_are_each_taken_once_then_made_on_the_spot() -> None:
    numbers = itertools.count()
    ahead = InputsAhead(lambda: [next(numbers)], 3)
    ahead.thread.join(timeout=10)
    ahead.stop()
    taken = [ahead.take()[0] for _ in range(5)]
    assert sorted(taken[:3]) == [0, 1, 2]
    assert taken[3:] == [3, 4]  # made when asked, after the three ahead


def test_stop_halts_the_thread_before_its_count() -> None:
    release = threading.Event()

    def slow() -> list[Any]:
        release.wait(timeout=10)
        return [0]

    ahead = InputsAhead(slow, 1000)
    release.set()
    ahead.stop()
    assert not ahead.thread.is_alive()
    assert len(ahead.made) < 1000


def test_a_maker_that_fails_ahead_raises_when_asked_on_the_spot() -> None:
    def broken() -> list[Any]:
        raise ValueError("get_inputs failed")

    ahead = InputsAhead(broken, 4)
    ahead.stop()
    with pytest.raises(ValueError, match="get_inputs failed"):
        ahead.take()


def test_sets_ahead_fit_their_memory() -> None:
    assert sets_ahead(256, 16 << 20) == 16
    assert sets_ahead(256, 1 << 20) == SETS_AHEAD
    assert sets_ahead(256, 1 << 30) == 0
