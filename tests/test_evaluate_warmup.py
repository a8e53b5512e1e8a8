"""The judge's warm-up (`Judge._warming`): untimed pairs until neither side faults in
fresh memory, within a cap of pairs and of time; timing then counts only timed pairs."""

from __future__ import annotations

import time

from htam_engine.evaluate import judging
from htam_engine.evaluate.judging import Call, Judge

FAULTING = judging.WARMUP_FAULTS + 1


def pairs(*faults: tuple[int, int]) -> dict[str, list[Call]]:
    """Warm-up calls with these (reference, candidate) page faults."""
    return {
        role: [Call(10.0, 9.0, "", faults=pair[i]) for pair in faults]
        for i, role in enumerate(judging.ROLES)
    }


def test_the_least_warm_up_is_kept_even_without_faults() -> None:
    now = time.monotonic()
    assert Judge._warming(pairs(), now)
    assert Judge._warming(pairs((0, 0)), now)
    assert not Judge._warming(pairs((0, 0), (0, 0)), now)


def test_a_side_still_faulting_in_memory_goes_on_warming_up() -> None:
    now = time.monotonic()
    assert Judge._warming(pairs((0, 0), (0, FAULTING)), now)
    assert Judge._warming(pairs((FAULTING, 0), (0, 0)), now), "one clean pair is not enough"
    assert not Judge._warming(pairs((FAULTING, 0), (0, 0), (0, 0)), now)
    assert not Judge._warming(pairs((judging.WARMUP_FAULTS, 0), (0, 0)), now)


def test_warm_up_ends_at_its_caps_however_the_sides_fault() -> None:
    always = [(FAULTING, FAULTING)] * judging.WARMUP_MAX
    assert Judge._warming(pairs(*always[:-1]), time.monotonic())
    assert not Judge._warming(pairs(*always), time.monotonic())
    long_ago = time.monotonic() - judging.WARMUP_MAX_S - 0.1
    assert not Judge._warming(pairs(*always[:3]), long_ago)


def test_samples_are_the_timed_calls_only() -> None:
    calls = pairs((0, 0), (0, 0), (0, 0))
    reference, candidate, _ = judging.samples(calls)
    assert len(reference) == len(candidate) == 3
