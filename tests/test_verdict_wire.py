"""The verdict on the wire: every field the engine writes is one the server reads back.

The engine writes a verdict (`htam eval --json`, the verdict cache, a `Step` event of
`htam optimize --events`, the editor's stored history) only by `Verdict.to_json` and
reads it only by `Verdict.from_json`; these tests hold every field to that, so a field
added without serialisation fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from htam_engine import events
from htam_engine.decisions import GlobalDecision, LocalDecision
from htam_engine.evaluate import protocol
from htam_engine.evaluate.verdict import Check, Duel, ErrorKind, EvalError, Verdict
from htam_engine.placement import Placement, Unplaced
from htam_engine.stats import Interval
from htam_engine.vocabulary import FAILED_STATUS, STATUS_TABLE, Status
from htam_lsp import jobs, render
from htam_lsp import suggestions as sg

ROOT = Path(__file__).resolve().parent.parent
# A value for every field of a Verdict, none of them its default.
FULL: dict[str, Any] = {
    "compiled": True,
    "correct": True,
    "runtime_ms": 0.29,
    "ref_runtime_ms": 0.42,
    "speedup": 1.46,
    "device": "cuda",
    "samples": {"reference": [0.42, 0.43], "candidate": [0.29, 0.3]},
    "spread": {"candidate_cv": 0.01, "harness_ms": 0.002},
    "checks": [Check("output.values", True, "max error 1e-7")],
    "error": EvalError(ErrorKind.CUDA_ERROR, "illegal address", "  x[i] = y;", 12),
    "cached": True,
    "suspect": True,
    "inputs_checked": 3,
    "phase_seconds": {"compile": 1.5, "time": 3.25},
    "sandbox": "bwrap",
    "threads": 2,
    "note": "timed on one input set",
    "interval": Interval(1.46, 1.41, 1.52, 80),
    "within_run_half_width": 0.012,
    "converged": True,
    "load": {"before": 0.5, "after": 0.75, "cores": 2},
    "noisy": True,
    "allow_torch": ["gemm"],
    "torch_ops": ["mm"],
    "scaled": {"factor": 0.1, "sizes": {"batch_size": [4096, 409]}},
    "roofline": Placement(
        33554432, 0, "memory", "core", 19.8, 100.0, 1.6947, 12.1, 0.0, 0.61, 0.42, False, "abc"
    ),
    "compile_baseline": {"speedup": 1.1, "low": 1.0, "high": 1.2, "compile_s": 31.5},
    "builds": {"candidate": "reused", "incumbent": "kept"},
    "shape_only": True,
    "vectorizer": "line 2 `for (long i = 0; i < n; ++i)`: loop vectorized using 64 byte vectors",
}
# The `htam eval --json` document's keys (README): the fields, the two interval parts as one
JSON_KEYS = set(FULL) - {"within_run_half_width"}


def _wire(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, allow_nan=False))


def test_the_sample_names_every_field_with_a_value_that_is_not_its_default() -> None:
    """Fails when a field is added to Verdict: give it a sample here, and serialisation."""
    assert set(FULL) == {f.name for f in fields(Verdict)}
    default = Verdict()
    for name, value in FULL.items():
        assert value != getattr(default, name), name


def test_every_field_round_trips_through_json() -> None:
    verdict = Verdict(**FULL)
    data = _wire(verdict.to_json())
    assert set(data) == JSON_KEYS
    assert Verdict.from_json(data) == verdict


@pytest.mark.parametrize("name", sorted(FULL))
def test_every_field_is_written(name: str) -> None:
    """Leaving one field at its default changes the document: none goes unwritten."""
    full = Verdict(**FULL)
    without = replace(full, **{name: getattr(Verdict(), name)})
    assert without.to_json() != full.to_json()
    assert Verdict.from_json(_wire(without.to_json())) == without


def test_the_interval_keeps_its_documented_shape() -> None:
    data = Verdict(**FULL).to_json()["interval"]
    assert set(data) == {"estimate", "low", "high", "pairs", "half_width", "within_run_half_width"}
    assert data["half_width"] == pytest.approx(FULL["interval"].half_width)
    assert Verdict().to_json()["interval"] == {}


def test_a_verdict_an_older_version_stored_still_reads() -> None:
    """What the editor's history kept before (a few keys), and an unknown key."""
    old = {"compiled": True, "correct": True, "speedup": 2.0, "runtime_ms": 0.5}
    old |= {"error": None, "inputs_checked": 3, "sandbox": "bwrap", "retired_key": 1}
    verdict = Verdict.from_json(old)
    assert verdict == Verdict(True, True, 0.5, None, 2.0, inputs_checked=3, sandbox="bwrap")
    assert verdict.interval is None and verdict.within_run_half_width is None


# The roofline as every earlier version wrote it (`roofline.place`, then `for_verdict`'s
# machine), key order included: read, then written back, the same bytes.
OLD_ROOFLINES: list[dict[str, Any]] = [
    {
        "bytes": 33554432, "flops": 0, "bound": "memory", "where": "core",
        "bandwidth_gbs": 19.812, "peak_gflops": 98.5, "roofline_ms": 1.6936528017,
        "achieved_gbs": 12.084, "achieved_gflops": 0.0, "fraction": 0.6101,
        "reference_fraction": 0.4212, "faster_than_light": False, "machine": "0123456789abcdef",
    },
    {
        "bytes": 12582912, "flops": 2147483648, "bound": "compute", "where": "GPU",
        "bandwidth_gbs": 3352.0, "peak_gflops": 51200.0, "roofline_ms": 0.0419,
        "achieved_gbs": 150.5, "achieved_gflops": 25600.125, "fraction": 0.5,
        "faster_than_light": True, "machine": "fedcba9876543210",
    },
    {"why": "the GPU's limits were not measured"},
    {},
]  # fmt: skip


@pytest.mark.parametrize("old", OLD_ROOFLINES)
def test_a_roofline_an_older_version_wrote_reads_and_writes_back_the_same(
    old: dict[str, Any],
) -> None:
    row = json.dumps({"compiled": True, "correct": True, "roofline": old})
    verdict = Verdict.from_json(json.loads(row))
    placed = verdict.roofline
    if "fraction" in old:
        assert isinstance(placed, Placement) and placed.fraction == old["fraction"]
    elif "why" in old:
        assert placed == Unplaced(old["why"])
    else:
        assert placed is None
    written = verdict.to_json()["roofline"]
    assert json.dumps(written) == json.dumps(old)  # the same keys, values and order


@pytest.mark.parametrize(
    "duel",
    [
        Duel.pooled(Interval(1.05, 0.99, 1.11, 120), confirmed=False, duels=3),
        Duel.pooled(Interval(1.2, 1.1, 1.3, 40), confirmed=True, duels=1),
        Duel.failed(ErrorKind.CRASH),
        Duel.failed(None),
    ],
)
def test_a_duel_round_trips_in_the_keys_of_versus_best(duel: Duel) -> None:
    data = _wire(duel.to_json())
    timed = {"speedup", "low", "high", "confirmed", "duels", "against"}
    assert set(data) == (timed if duel.speedup is not None else {"error", "against"})
    assert Duel.from_json(data) == duel
    assert Duel.from_json({}) is None


def _step(verdict: Verdict, duel: Duel | None) -> events.Step:
    return events.Step(
        3, "data_reuse", "smem_tiling", "why", "improved", 0.4, 1.46,
        GlobalDecision.from_json({"chosen": "data_reuse"}), LocalDecision("smem_tiling", ""),
        verdict, "src",
        prompt_tokens=12, note="repaired", llm={"attempts": 1}, versus_best=duel,
    )  # fmt: skip


def test_the_server_reads_exactly_the_step_the_engine_writes() -> None:
    """The engine's event line, read by the server's parser, then kept in its history
    (trimmed of raw measurements) and read back from the store: the same fields."""
    duel = Duel.pooled(Interval(1.3, 1.2, 1.4, 80), confirmed=True, duels=2)
    step = _step(Verdict(**FULL), duel)
    read = events.parse_line(events.to_line(step))
    assert read == step
    record = sg.StepRecord(1, sg.trimmed(read), 0.0, sg.Anchor("a", "b"), "start")
    stored = sg.StepRecord.from_json(_wire(record.to_json()))
    assert stored == record
    assert stored.step.verdict == Verdict(**FULL).summary()
    assert stored.step.versus_best == duel
    assert (stored.runtime_ms, stored.ref_ms, stored.inputs) == (0.29, 0.42, 3)
    assert stored.step.error == FULL["error"]


def test_the_title_shows_the_engine_s_numbers() -> None:
    verdict = Verdict(compiled=True, correct=True, runtime_ms=0.29, ref_runtime_ms=0.25)
    claim = sg.Claim(True, 0, 1.46, 1.41, 1.52)
    record = sg.StepRecord(1, _step(verdict, None), 0.0, claim=claim)
    record = sg.StepRecord.from_json(_wire(record.to_json()))
    assert record is not None
    assert render.gain_text(record) == (
        "1.46x faster than your code (95 % 1.41-1.52; 0.423 -> 0.29 ms; PyTorch 0.25 ms)"
    )
    unconfirmed = replace(record, claim=replace(claim, confirmed=False))
    assert render.gain_text(unconfirmed).startswith("not confirmed faster: 1.46x (95 % ")


def test_the_server_reads_htam_eval_s_document() -> None:
    """The compile check's and the speed-of-light line's one reader of `htam eval --json`."""
    verdict = Verdict(**FULL)
    assert jobs.printed_verdict(json.dumps(verdict.to_json()).encode()) == verdict
    assert jobs.printed_verdict(b"Traceback ...") is None
    assert jobs.printed_verdict(b"[1, 2]") is None


def test_every_error_kind_that_fails_a_compiled_candidate_has_its_status() -> None:
    """oom, runtime_error and cuda_error are no longer `incorrect` in the loop."""
    for kind, status in FAILED_STATUS.items():
        assert status.value == kind.value and status in STATUS_TABLE
    assert {ErrorKind.OOM, ErrorKind.RUNTIME_ERROR, ErrorKind.CUDA_ERROR} <= set(FAILED_STATUS)
    assert STATUS_TABLE[Status.OOM].penalty == STATUS_TABLE[Status.INCORRECT].penalty


def test_an_unknown_error_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown error kind"):
        EvalError("segfault", "no such kind")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        protocol.Sized(16777216, None, "outputs unknown (RuntimeError)"),
        protocol.Compiled("bwrap"),
        protocol.Verified([Check("output.values", False, "set 2: max error 0.3")], 3),
        protocol.Timing(),
        protocol.Timed([1.0e-3, 1.1e-3], [0.7e-3, 0.8e-3], 0.002, [], 1, {"stolen_share": 0.1}),
        protocol.Failed("timeout", "verify exceeded its limit", "log", 4),
    ],
)
def test_each_judge_message_round_trips_through_its_line(message: protocol.Message) -> None:
    """What the judge prints, as the caller's `Child` reads it (stamped, token stripped)."""
    line = json.loads(json.dumps({**protocol.encode(message), "token": "t"}))
    line.pop("token")
    assert protocol.decode({**line, "_t": 12.5}, type(message)) == message


def test_a_judge_line_that_is_not_the_message_is_a_clear_error() -> None:
    with pytest.raises(protocol.ProtocolError, match="expected a 'timed'"):
        protocol.decode({"event": "verified", "checks": [], "sets": 3}, protocol.Timed)
    with pytest.raises(protocol.ProtocolError, match="malformed 'verified'"):
        protocol.decode({"event": "verified", "checks": [{"passed": True}]}, protocol.Verified)


def test_the_verdict_s_types_import_without_the_evaluator() -> None:
    """The server reads verdicts and events without loading the runner (or torch)."""
    code = (
        "import sys, htam_engine.events, htam_engine.evaluate.protocol, htam_lsp.render\n"
        "heavy = {'torch', 'htam_engine.evaluate.runner'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
