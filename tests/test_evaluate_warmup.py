"""The judge's warm-up (`Judge._warming`): untimed pairs until neither side faults in
fresh memory, within a cap of pairs and of time; timing then counts only timed pairs.
And the harness's part: nothing it holds makes a warm call fault."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

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


def test_a_calls_outputs_are_let_go_before_the_next_forward(tmp_path: Path) -> None:
    """The harness kept a call's outputs (for its `late` check) through the next call's
    forward: the reference's fresh 8 MiB output could not reuse its twin's hole, and a
    third of an L2 norm reference's timed calls faulted in fresh pages (+3 ms of 1 ms)."""
    torch = pytest.importorskip("torch")
    from htam_engine.evaluate import common, worker
    from htam_engine.evaluate.jobspec import WorkerJob

    job = WorkerJob("t", "py", "cpu", None, "cpu", 0, ())
    (tmp_path / "job.json").write_text(json.dumps(job.to_json()))
    harness = worker.Harness(tmp_path, "reference", io.StringIO())
    held: list[int] = []

    def forward(x: Any) -> Any:
        held.append(len(harness.last))
        return x * 2

    harness.model = forward
    x = torch.arange(4, dtype=torch.float32)
    (inputs, in_size), (out, out_size) = common.layout([x]), common.layout([x * 2])
    (tmp_path / "in.bin").write_bytes(x.numpy().tobytes().ljust(in_size, b"\0"))
    (tmp_path / "out.bin").write_bytes(b"\0" * out_size)
    command = {"inputs": inputs, "in_size": in_size, "out": out, "out_size": out_size}
    for k in range(3):
        harness.call({"cmd": "call", "k": k, **command})
        assert harness.last and torch.equal(harness.last[0], x * 2)  # kept for `late`
    assert held == [0, 0, 0]
    stored = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float32)
    assert torch.equal(stored[:4], x * 2)
