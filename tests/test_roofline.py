"""Speed of light: the roofline arithmetic on hand-computed tasks, the task's work counted
on the reference, the cache of this machine's limits (a real measurement, once per home),
faster than light as a check, and torch.compile's baseline failing without losing eager's
number."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.hermetic import environment_in, second_home

from htam_engine import roofline
from htam_engine.evaluate import Limits, evaluate
from htam_engine.evaluate.verdict import Verdict
from htam_engine.formatting import format_compile, format_roofline
from htam_engine.paths import subdir
from htam_engine.placement import Placement, Unplaced
from htam_engine.roofline import Bound, MachineLimits, Work
from htam_engine.stats import Interval
from htam_engine.task import load_task, with_policy

FIXTURES = Path(__file__).parent / "fixtures" / "roofline"
MIB = 1 << 20
QUICK = Limits(compile_s=120, verify_s=60, time_s=60)


@pytest.fixture(autouse=True)
def own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests keep limits in their own home, not in the session's shared file."""
    monkeypatch.delenv(roofline.LIMITS_ENV, raising=False)


def _limits(**changes: object) -> MachineLimits:
    """Limits with round numbers: 1 thread streams 40 GB/s in a 4 MiB working set and
    10 GB/s beyond; 100 GFLOP/s."""
    limits = MachineLimits(
        fingerprint=roofline.fingerprint(),
        cpu="test cpu",
        isa="avx2",
        fp32_lanes=8,
        cores=2,
        bandwidth={
            "1": [[2 * MIB, 40.0], [64 * MIB, 10.0]],
            "all": [[2 * MIB, 80.0], [64 * MIB, 20.0]],
        },
        peak_gflops={"1": 100.0, "all": 200.0},
        numpy_copy_gbs=9.0,
    )
    return replace(limits, **changes)  # type: ignore[arg-type]


def test_a_softmax_is_held_to_the_bandwidth_at_its_footprint() -> None:
    """1024 x 4096 float32 in and out: 32 MiB moved, no counted FLOPs. At 10 GB/s that
    is 3.3554 ms; a kernel taking 6.7109 ms is at 50 %, moving 5 GB/s."""
    work = Work(inputs=16 * MIB, outputs=16 * MIB, parameters=0, flops=0)
    limits = _limits()
    bound = roofline.bound_for(work, limits)
    assert bound == Bound(10.0, 100.0, "core")
    best, limiting = roofline.roofline_ms(work, bound)
    assert limiting == "memory" and best == pytest.approx(3.3554432)
    placed = roofline.place(work, bound, runtime_ms=6.7108864, ref_runtime_ms=4.194304)
    assert placed is not None
    assert placed.fraction == pytest.approx(0.5)
    assert placed.achieved_gbs == pytest.approx(5.0)
    assert placed.reference_fraction == pytest.approx(0.8)
    assert placed.faster_than_light is False
    assert roofline.describe(placed) == "at 50 % of this core's memory bandwidth (5 of 10 GB/s)"
    assert roofline.tags(placed) == ["memory_bound"]


def test_a_small_working_set_is_held_to_the_cache_s_bandwidth() -> None:
    """256 KiB in and out fit the 2 MiB point's working set (two arrays): 40 GB/s."""
    work = Work(inputs=256 << 10, outputs=256 << 10, parameters=0, flops=0)
    assert roofline.bound_for(work, _limits()).bandwidth_gbs == 40.0
    huge = Work(inputs=1 << 30, outputs=0, parameters=0, flops=0)  # past the curve: its end
    assert roofline.bound_for(huge, _limits()).bandwidth_gbs == 10.0


def test_a_gemm_is_compute_bound() -> None:
    """1024^3 GEMM: 2.147 GFLOP at 100 GFLOP/s = 21.47 ms; its 12 MiB at 10 GB/s take only
    1.26 ms. At 23.86 ms it reaches 90 GFLOP/s: near its limit."""
    n = 1024
    work = Work(inputs=2 * n * n * 4, outputs=n * n * 4, parameters=0, flops=2 * n**3)
    bound = roofline.bound_for(work, _limits())
    best, limiting = roofline.roofline_ms(work, bound)
    assert limiting == "compute" and best == pytest.approx(21.474836)
    placed = roofline.place(work, bound, runtime_ms=best / 0.9)
    assert placed is not None and placed.achieved_gflops == pytest.approx(90.0)
    assert roofline.tags(placed) == ["compute_bound", "near_limit"]
    assert roofline.describe(placed, short=True) == "at 90 % of this core's FP32 peak"


def test_the_harness_s_share_of_every_call_is_part_of_the_fastest_call() -> None:
    """Every timed call holds the harness's own work (staging the inputs, copying the
    outputs out: 0.85 ms of a 256x512x512 GEMM's 2.61 ms, measured): no call beats the
    floor plus that share, so the fraction counts it (a capable model saw 43 % of peak
    where the call was at 76 % of what this machine allows). Light ignores the share."""
    n = 1024
    work = Work(inputs=2 * n * n * 4, outputs=n * n * 4, parameters=0, flops=2 * n**3)
    bound = roofline.bound_for(work, _limits())
    best, _ = roofline.roofline_ms(work, bound)  # 21.47 ms
    placed = roofline.place(work, bound, runtime_ms=2 * best, ref_runtime_ms=3 * best,
                            harness_ms=best / 2)  # fmt: skip
    assert placed is not None and placed.harness_ms == pytest.approx(best / 2, rel=1e-3)
    assert placed.fraction == pytest.approx(0.75) and placed.reference_fraction == 0.5
    assert placed.achieved_gflops == pytest.approx(50.0)  # over the whole call
    text = roofline.describe(placed)
    assert text.startswith("at 75 % of this core's FP32 peak (50 of 100 GFLOP/s over the whole")
    assert "its floor 21.5 ms + the harness's 11 ms a call" in text
    near = roofline.place(work, bound, runtime_ms=1.2 * best, harness_ms=0.1 * best)
    assert near is not None and "near_limit" in roofline.tags(near)
    light = roofline.place(work, bound, runtime_ms=0.95 * best, harness_ms=best)
    assert light is not None and not light.faster_than_light  # the share is no light
    assert "near_limit" not in roofline.tags(light)  # the share was told too high
    assert "the harness's share was told too high" in roofline.describe(light)
    at = roofline.place(work, bound, runtime_ms=1.02 * best, harness_ms=0.1 * best)
    assert at is not None and "near_limit" in roofline.tags(at)  # 108 %: within noise
    assert Placement.from_json(placed.to_json()) == placed


def test_faster_than_light_needs_the_slow_end_of_the_interval_to_beat_the_bound() -> None:
    work = Work(inputs=16 * MIB, outputs=16 * MIB, parameters=0, flops=0)  # 3.3554 ms at best
    bound = roofline.bound_for(work, _limits())
    fast = roofline.place(work, bound, runtime_ms=2.0, slowest_ms=2.5)
    assert fast is not None and fast.fraction > 1 and fast.faster_than_light is True
    assert "faster than light" in roofline.describe(fast)
    unsure = roofline.place(work, bound, runtime_ms=2.9, slowest_ms=3.2)  # within 10 %
    assert unsure is not None and unsure.fraction > 1 and unsure.faster_than_light is False
    assert roofline.place(Work(0, 0, 0, 0, why="meta failed"), bound, 1.0) is None


def test_the_work_is_counted_on_the_reference() -> None:
    """nn.Linear(512, 256) on 64 x 512: 2*64*512*256 FLOPs, weight and bias once."""
    work = roofline.task_work((FIXTURES / "linear_ref.py").read_text())
    assert work.known, work.why
    assert (work.inputs, work.outputs) == (64 * 512 * 4, 64 * 256 * 4)
    assert work.parameters == (256 * 512 + 256) * 4
    assert work.flops == 2 * 64 * 512 * 256
    softmax = roofline.task_work((FIXTURES / "softmax_ref.py").read_text())
    assert (softmax.bytes, softmax.flops) == (2 * 256 * 1024 * 4, 0)
    kept = list(subdir("work").glob("*.json"))
    assert len(kept) == 2  # by content: asking again reads them
    assert roofline.task_work((FIXTURES / "linear_ref.py").read_text()) == work


def test_a_reference_that_cannot_be_counted_says_why() -> None:
    work = roofline.task_work("raise SystemExit('no model here')\n")
    assert not work.known and "failed" in work.why


def test_the_fp32_peak_is_the_cores_fma_rate_not_only_torchs_gemm() -> None:
    """The FMA chains reach at least what torch's GEMM does (no honest kernel beats the
    core's FMA rate; torch's GEMM may be far below it, and a peak taken from it alone
    called an honest register-tiled matmul faster than light)."""
    import torch

    torch.set_num_threads(1)
    assert roofline._fma_gflops() >= 0.8 * roofline._gemm_gflops(torch, 512)


def test_the_machine_is_measured_once_and_kept_by_its_fingerprint(
    htam_home: Path,
) -> None:
    """A real measurement, in rounds, kept for every HTAM home on the machine: another
    home reads it; the second ask reads it; a refresh keeps the best of each number (a
    neighbour only ever makes one low)."""
    path = roofline.cached_path()
    assert path.parent == roofline.machine_dir() and path.name.startswith(roofline.fingerprint())
    assert roofline.cached_limits() is None
    limits = roofline.machine_limits()
    assert path.exists() and roofline.cached_limits() == limits
    least, most = roofline.ROUNDS
    assert least <= len(limits.rounds) <= most
    assert limits.stable == (not roofline.unsettled(limits.rounds))
    if len(limits.rounds) < most:
        assert limits.stable, "it stops early only when two rounds agree"
    best = roofline.headline(limits)
    assert best == {name: max(r[name] for r in limits.rounds) for name in best}
    sizes = [size for size, _ in limits.bandwidth["1"]]
    assert sizes == list(roofline.CURVE_BYTES)
    assert all(gbs > 0 for _, gbs in limits.bandwidth["1"] + limits.bandwidth["all"])
    assert limits.peak_gflops["1"] > 0 and limits.numpy_copy_gbs > 0
    assert limits.fp32_lanes >= 1 and limits.cores >= 1
    stamp = path.stat().st_mtime_ns
    assert roofline.machine_limits() == limits and path.stat().st_mtime_ns == stamp
    # `htam machine --json` in another home prints the kept limits (no new measurement):
    # shared by every home on the machine
    done = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "machine", "--json"],
        capture_output=True, text=True, timeout=60,
        env=environment_in(second_home(htam_home, "another home")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert MachineLimits.from_json(json.loads(done.stdout)) == limits
    assert path.stat().st_mtime_ns == stamp
    said = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "machine"],
        capture_output=True, text=True, timeout=60,
    ).stderr  # fmt: skip
    assert f"measured in {len(limits.rounds)} rounds" in said and str(path) in said
    first = limits.rounds[0]["FP32 GFLOP/s"]
    assert f"FP32 GFLOP/s: {first:.3g}" in said, said


def test_rounds_agree_when_the_best_two_of_every_number_are_close() -> None:
    """A round made low by a neighbour does not count against agreement; one number
    whose best two differ by more than `AGREE` does."""
    base = roofline.headline(_limits())
    low = {name: value / 2 for name, value in base.items()}
    close = {name: value * (1 - roofline.AGREE / 2) for name, value in base.items()}
    assert roofline.unsettled([base]) == list(base)
    assert roofline.unsettled([base, low]) == list(base)
    assert roofline.unsettled([base, low, close]) == []
    apart = {**close, "FP32 GFLOP/s": base["FP32 GFLOP/s"] * (1 - 2 * roofline.AGREE)}
    assert roofline.unsettled([base, low, apart]) == ["FP32 GFLOP/s"]
    kept = _limits(rounds=[base, low, close])
    assert roofline.spread(kept)["FP32 GFLOP/s"] == pytest.approx(0.5)


def test_a_cache_from_an_older_schema_is_not_believed() -> None:
    path = roofline.cached_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**_limits().to_json(), "schema": roofline.SCHEMA - 1}))
    assert roofline.cached_limits() is None
    path.write_text("{not json")
    assert roofline.cached_limits() is None


def _kept(limits: MachineLimits) -> None:
    path = roofline.cached_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(limits.to_json()))


def test_a_timed_verdict_is_placed_and_one_faster_than_light_is_suspect() -> None:
    """With limits kept in this home (no measurement), the verdict gets its roofline;
    with a machine kept impossibly slow, the same numbers beat light: the machine is
    measured again (limits only rise: the kept peak, higher than any, stays), and only a
    candidate still beyond it is suspect."""
    source = (FIXTURES / "softmax_ref.py").read_text()
    timed = Verdict(compiled=True, correct=True, runtime_ms=0.2, ref_runtime_ms=0.1, speedup=0.5)
    timed.interval = Interval(0.5, 0.45, 0.55, 40)
    _kept(_limits())
    verdict = replace(timed)
    roofline.for_verdict(source, verdict)
    light = verdict.roofline
    assert isinstance(light, Placement)
    assert light.bound == "memory" and light.bandwidth_gbs == 40.0  # 2 MiB fits
    assert light.fraction == pytest.approx(2 * MIB / 40e9 * 1e3 / 0.2, rel=1e-3)
    assert light.machine == roofline.fingerprint() and not verdict.suspect
    assert format_roofline(verdict) == f"{100 * light.fraction:.0f} % memory"
    # 2 MiB in 0.2 ms is 10.5 GB/s: against 1 GB/s that is faster than light until the
    # real machine is measured (it streams more than 10.5 GB/s... or it does not)
    slow = {"1": [[size, 1.0] for size in roofline.CURVE_BYTES]}
    _kept(_limits(bandwidth={**slow, "all": slow["1"]}, peak_gflops={"1": 1e9, "all": 1e9}))
    again = replace(timed)
    roofline.for_verdict(source, again)
    measured = roofline.cached_limits()
    assert measured is not None and measured.bandwidth["1"][0][1] > 1.0  # measured again
    assert measured.peak_gflops["1"] == 1e9  # the best of each number is kept
    bandwidth = measured.bandwidth_at(2 * MIB)
    assert isinstance(again.roofline, Placement)
    assert again.roofline.bandwidth_gbs == pytest.approx(bandwidth, rel=1e-3)
    achieved_slowest = 2 * MIB / (0.2e-3 * 0.5 / 0.45) / 1e9  # GB/s at the slow end
    beyond = achieved_slowest > 1.1 * bandwidth
    assert again.suspect is beyond and again.roofline.faster_than_light is beyond


def test_an_untimed_verdict_gets_no_roofline() -> None:
    verdict = Verdict(compiled=True, correct=True)
    roofline.for_verdict("irrelevant", verdict)
    assert verdict.roofline is None and format_roofline(verdict) == "-"
    assert verdict.to_json()["roofline"] == {}
    assert Verdict.from_json({"compiled": True}).roofline is None  # an older row
    assert Verdict.from_json({"compiled": True, "roofline": {}}).roofline is None


def test_a_verdict_that_cannot_be_placed_says_why() -> None:
    """A GPU verdict where the GPU's limits were never measured: unplaced, and why (on the
    wire as `{"why": ...}`); nothing describes, tags or formats it."""
    _kept(_limits())
    verdict = Verdict(compiled=True, correct=True, runtime_ms=0.2, ref_runtime_ms=0.1)
    verdict.device, verdict.interval = "cuda", Interval(0.5, 0.45, 0.55, 40)
    roofline.for_verdict("irrelevant", verdict, work=Work(MIB, MIB, 0, 0))
    assert verdict.roofline == Unplaced("the GPU's limits were not measured")
    assert verdict.to_json()["roofline"] == {"why": "the GPU's limits were not measured"}
    assert roofline.describe(verdict.roofline) == "" and roofline.tags(verdict.roofline) == []
    assert format_roofline(verdict) == "-" and not verdict.suspect


def test_a_torch_compile_that_fails_says_so_and_keeps_eager_s_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No C++ compiler for inductor (CXX reaches the worker): the compiled reference
    fails to build; the candidate (torch's own softmax, allowed: it needs no compiler)
    keeps its eager verdict and the baseline says why."""
    _kept(_limits())
    task = with_policy(load_task(FIXTURES / "softmax_torch.py"), allow_torch="softmax,_softmax")
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    children: list[list[str]] = []
    child = roofline._child
    monkeypatch.setattr(
        roofline, "_child", lambda argv, *a: children.append(argv) or child(argv, *a)
    )
    verdict = evaluate(task, task.impl_source or "", device="cpu", limits=QUICK, baseline="compile")
    assert verdict.error is None, verdict.error
    assert verdict.correct and verdict.speedup and verdict.interval is not None
    assert isinstance(verdict.roofline, Placement)  # placed: it has a fraction
    assert verdict.roofline.bytes == 2 * 256 * 1024 * 4
    assert children == [], "the judge counted the work: no child ran"
    assert roofline.kept_work(task.reference_source) is not None, "kept: the next judge skips it"
    error = verdict.compile_baseline.get("error", "")
    assert error and "speedup" not in verdict.compile_baseline
    assert format_compile(verdict).startswith("n/a (torch.compile failed: ")


def test_the_compile_baseline_is_written_with_its_interval_and_compile_time() -> None:
    verdict = Verdict(compile_baseline={"speedup": 1.1, "low": 1.0, "high": 1.2, "compile_s": 31.6})
    assert format_compile(verdict) == "1.10x (95 % 1.00-1.20; compiled in 32 s)"
    assert format_compile(Verdict()) == "-"


def test_a_cached_verdict_is_placed_again_on_the_limits_kept_now() -> None:
    """Limits only rise after a verdict was stored: read back, it is placed on today's."""
    work = Work(inputs=16 * MIB, outputs=16 * MIB, parameters=0, flops=0)
    stored = Verdict(compiled=True, correct=True, runtime_ms=6.7108864, ref_runtime_ms=4.194304)
    stored.roofline = roofline.place(work, Bound(5.0, 100.0, "core"), 6.7108864, 4.194304)
    assert stored.roofline is not None and stored.roofline.fraction == pytest.approx(1.0)
    _kept(_limits())  # 10 GB/s at this footprint
    roofline.replace_on_kept(stored)
    assert isinstance(stored.roofline, Placement)
    assert stored.roofline.fraction == pytest.approx(0.5)
    assert stored.roofline.reference_fraction == pytest.approx(0.8)
    assert stored.roofline.machine == roofline.fingerprint()
