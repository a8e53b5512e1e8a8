"""The facts block every generation prompt carries, and the one feedback vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from htam_engine import machine
from htam_engine.evaluate import Check, Duel, ErrorKind, EvalError, Verdict
from htam_engine.events import Step
from htam_engine.llm import facts, generation_prompt, translation_prompt
from htam_engine.llm.prompts import BUDGET
from htam_engine.llm.tokens import count_tokens
from htam_engine.vocabulary import OTHER_SHARE, WIDE_MAGNITUDE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LINEAR = (EXAMPLES / "linear_relu" / "reference.py").read_text()
KERNELBENCH = Path(__file__).parent / "fixtures" / "kernelbench"


def verdict(ms: float, ref_ms: float = 1.0) -> Verdict:
    return Verdict(compiled=True, correct=True, runtime_ms=ms, ref_runtime_ms=ref_ms,
                   speedup=ref_ms / ms, converged=True)  # fmt: skip


def test_the_machine_is_read_from_this_host() -> None:
    found = machine.cpu_facts()
    assert set(found.isa) <= set(machine.ISA_FLAGS)
    assert found.cores >= 1 and found.cpu
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    assert [f for f in machine.ISA_FLAGS if f in flags] == found.isa
    if machine.CPU_CACHES.is_dir():
        assert any(c.startswith("L1d ") for c in found.caches)


def test_the_core_generation_says_how_wide_the_vector_units_really_are() -> None:
    """A virtual machine names its CPU "AMD EPYC": both answerers asked whether AVX-512
    is double-pumped here."""
    amd = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17"}
    assert machine.core_generation(amd, {"avx512f"}).startswith("Zen 4")
    assert "two 256-bit halves" in machine.core_generation(amd, {"avx512f"})
    assert machine.core_generation(amd, {"avx2"}).startswith("Zen 3")
    intel = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "143"}
    assert machine.core_generation(intel, set()).startswith("Sapphire Rapids")
    assert machine.core_generation({**intel, "model": "151"}, set()) == ""  # not a server core
    assert machine.core_generation({}, set()) == ""
    found = machine.cpu_facts()
    text = facts.machine_text("cpu", 1)
    assert (f"Core: {found.core}" in text) == bool(found.core)


def test_the_facts_block_states_what_an_engineer_asks_first() -> None:
    text = facts.facts_block(backend="cpu", threads=1, reference=LINEAR,
                             start=verdict(4.0), best=verdict(2.0), best_step=2)  # fmt: skip
    found = machine.cpu_facts()
    assert found.cpu in text and f"{found.cores} cores" in text
    assert all(flag in text for flag in found.isa)
    assert "1 thread(s)" in text and "OpenMP or other threads buy nothing" in text
    assert "atol = rtol by output dtype" in text and "float32 0.0001" in text
    assert "`cheating`" in text and "`not_custom_kernel`" in text
    assert "x0: float32[128, 1024]" in text
    assert "weight (1024, 1024) = (out_features, in_features)" in text
    assert "torch.manual_seed(S)" in text
    assert "PyTorch reference: 1 ms; starting implementation: 4 ms (0.25x over PyTorch)" in text
    assert (
        "Best kept (step 2, the code shown below): 2 ms against PyTorch's 1 ms in the same "
        "pairs (0.50x over PyTorch)" in text
    )
    assert "relative L2 error at most 0.0001 (float32)" in text and "16x the PyTorch" in text
    assert "may be done once in __init__" in text
    assert f"|x| = {WIDE_MAGNITUDE:g} with both signs" in text  # what wider.py runs
    assert f"near {OTHER_SHARE:.0%} of it" in text and "`shape_only`" in text
    assert "-shared -fPIC -std=c++17" in text and "caches by source and flags" in text
    assert "outputs are copied out right after, inside the timed call" in text
    assert count_tokens(text) <= BUDGET["facts"]


def test_a_full_facts_block_fits_its_budget_uncut() -> None:
    """The largest facts a CPU prompt carries (times, the harness's share, the vectorizer
    report at its cap) are shown whole: before, the report's head was cut."""
    from dataclasses import replace

    from htam_engine.evaluate.judging import VECTORIZER_CHARS

    line = "line 66 `for (long long j = 0; j < inner; ++j) { double v = r`: not vectorized\n"
    report = (line * (VECTORIZER_CHARS // len(line)))[:VECTORIZER_CHARS]
    start = replace(verdict(4.0), spread={"harness_ms": 3.0})
    best = replace(verdict(2.0), vectorizer=report, spread={"harness_ms": 2.0})
    text = facts.facts_block(backend="cpu", threads=1, reference=LINEAR, start=start,
                             best=best, best_step=2)  # fmt: skip
    assert report.splitlines()[0] in text and "harness's own work (2 ms in the newest" in text
    assert count_tokens(text) <= BUDGET["facts"]


@pytest.mark.parametrize(
    ("fixture", "shape"),
    [
        ("level1/19_ReLU.py", "x0: float32[16, 1024]"),
        ("level2/1_Conv2D_ReLU_BiasAdd.py", "x0: float32[2, 3, 16, 16]"),
    ],
)
def test_shapes_are_read_statically_from_kernelbench_problems(fixture: str, shape: str) -> None:
    text = facts.task_text((KERNELBENCH / fixture).read_text())
    assert shape in text


def test_the_prompt_states_the_evaluators_tolerance_for_each_dtype() -> None:
    torch = pytest.importorskip("torch")
    from htam_engine.evaluate import common

    reference = (KERNELBENCH / "level1/19_ReLU.py").read_text()
    checks = facts.facts_block(backend="cpu", threads=1, reference=reference)
    for name in ("float64", "float32", "float16", "bfloat16"):
        assert f"{name} {common.tolerance(getattr(torch, name)):g}" in checks
    assert common.tolerance(torch.int64) == 0.0


def step(number: int, status: str, v: Verdict, **kw: object) -> Step:
    return Step(number, "vectorization", "omp_simd", "r", status, 0.0,  # type: ignore[arg-type]
                kw.pop("speedup", None), verdict=v, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_a_step_faster_than_the_start_but_refused_is_never_called_slower() -> None:
    refused = step(2, "not_improved", verdict(1.2), speedup=8.46,
                   versus_best=Duel(1.08, 0.96, 1.21, False, 1))  # fmt: skip
    line = facts.step_line(refused)
    assert "over the start" not in line  # paired: no unpaired estimate beside it
    assert "1.08x over the best in pairs, 95 % 0.96-1.21: not kept" in line
    assert "0.83x over PyTorch" in line and "slower" not in line
    unpaired = step(2, "not_improved", verdict(1.2), speedup=0.24)
    assert "(est. 0.24x over the start)" in facts.step_line(unpaired)
    kept = step(3, "improved", verdict(1.0), speedup=10.0,
                versus_best=Duel(1.2, 1.1, 1.3, True, 1))  # fmt: skip
    assert "kept as the new best" in facts.step_line(kept)


def test_the_code_shown_is_named_when_it_is_a_tie_not_the_best() -> None:
    """A step that starts from a tie (the plateau the memory expects to pay off) showed
    its code under "Best kept (step 1, the code shown below)": a capable model could not
    tell which code to build on."""
    best = verdict(1.0)
    assert "Best kept (step 1, the code shown below)" in facts.times_text(best, best, 1)
    tie = facts.times_text(best, best, 1, shown=2)
    assert "Best kept (step 1)" in tie and "code shown below is step 2's: not kept" in tie


def test_every_figure_carries_its_interval_and_a_busy_one_says_it_is_inconclusive() -> None:
    from dataclasses import replace

    from htam_engine.stats import Interval

    timed = replace(verdict(0.5), interval=Interval(2.0, 1.9, 2.1, 40), spread={"harness_ms": 1.4})
    busy = replace(timed, interval=Interval(6.35, 2.91, 60.67, 12), speedup=6.35, noisy=True,
                   converged=False, load={"before": 4.2, "after": 5.1, "cores": 2})  # fmt: skip
    times = facts.times_text(busy, timed, 3)
    assert "2.00x (95 % 1.90-2.10) over PyTorch" in times
    assert (
        "6.35x (95 % 2.91-60.67) over PyTorch, inconclusive (noisy: load 5.1 on 2 cores)" in times
    )
    assert "harness's own work (1.4 ms in the newest timing" in times
    line = facts.step_line(step(4, "not_improved", replace(busy, suspect=True), speedup=3.1))
    assert "suspect (faster than this machine's limit" in line


def test_failures_say_why_with_the_compiler_excerpt_and_the_max_error() -> None:
    broken = Verdict(error=EvalError(ErrorKind.COMPILE_ERROR, "build failed",
                                     "k.cpp:3: error: '__m512' was not declared"))  # fmt: skip
    wrong = Verdict(compiled=True, checks=[Check("outputs", False, "3/10 values off by more "
                    "than atol=rtol=0.0001; worst at (0, 1): got 2, expected 1")])  # fmt: skip
    attempts = facts.attempts_text([step(1, "compile_error", broken), step(2, "incorrect", wrong)])
    first, second = attempts.splitlines()
    assert first.startswith("- step 2") and "worst at (0, 1): got 2, expected 1" in first
    assert "'__m512' was not declared" in second
    assert facts.failure_note(wrong).startswith("outputs: 3/10 values off")


def test_every_generation_prompt_carries_the_facts_and_whole_examples() -> None:
    block = facts.facts_block(backend="cpu", threads=1, reference=LINEAR)
    example = 'extern "C" void f() {}\n' + "// line\n" * 50 + "// THE END"
    system, prompt = generation_prompt(LINEAR, "code", "none", "### s", example, [], "python",
                                       facts=block)  # fmt: skip
    assert "## Facts" in prompt and "1 thread(s)" in prompt and "THE END" in prompt
    assert "one thread" in system and "OpenMP" in system
    huge = example * 200  # over the example's budget: left out, never cut
    _, cut = generation_prompt(LINEAR, "code", "none", "### s", huge, [], "python", facts=block)
    assert "THE END" not in cut and "worked" not in cut
    translate_system, translate = translation_prompt(LINEAR, "cpu", block)
    assert "## Facts" in translate and "above all be correct" in translate_system


def test_a_linear_without_bias_is_said_to_have_none() -> None:
    reference = LINEAR.replace("nn.Linear(in_features, out_features)",
                               "nn.Linear(in_features, out_features, bias=False)")  # fmt: skip
    text = facts.task_text(reference)
    assert "no bias (bias=False); forward computes x @ weight.T\n" in text + "\n"


def test_the_last_failed_attempt_is_the_newest_step_that_failed_with_code() -> None:
    from htam_engine.implement import last_failure

    wrong = Verdict(compiled=True, checks=[Check("outputs", False, "3/10 values off")])
    steps = [
        step(1, "incorrect", wrong, source="OLD WRONG"),
        step(2, "incorrect", wrong, source="NEW WRONG"),
        step(3, "no_code", Verdict()),
        step(4, "improved", verdict(0.5), source="RIGHT"),
    ]
    assert last_failure(steps) == ("NEW WRONG", "outputs: 3/10 values off")
    assert last_failure(steps[3:]) is None


def test_gccs_vectorizer_report_reaches_the_prompt_as_quoted_data() -> None:
    from htam_engine.kernels import vectorizer_report

    source = "void f(float* x, long n) {\n    for (long i = 0; i < n; ++i) x[i] *= 2;\n}\n"
    remarks = (
        "/tmp/a/kernel.cpp:2:24: optimized: loop vectorized using 64 byte vectors\n"
        "/tmp/a/kernel.cpp:2:24: optimized: loop vectorized using 64 byte vectors\n"
        "/tmp/a/kernel.cpp:1:6: note: vectorized 1 loops in function.\n"
    )
    report = vectorizer_report(remarks, source)
    assert (
        report
        == "line 2 `for (long i = 0; i < n; ++i) x[i] *= 2;`: loop vectorized using 64 byte vectors"
    )
    from dataclasses import replace

    block = facts.vectorizer_text(replace(verdict(0.5), vectorizer=report))
    assert "-fopt-info-vec" in block and "loop vectorized" in block and "quoted data" in block
    assert facts.vectorizer_text(verdict(0.5)) == ""


def test_negative_init_arguments_are_read_not_left_unknown() -> None:
    """KernelBench 53 passes hardtanh_min = -2: the prompt said `[1024, 0.5, '?', 2]`."""
    reference = (
        "import torch\nlo = -2\nhi = +2\nscale = -0.5\n"
        "def get_inputs():\n    return [torch.rand(8, 4)]\n"
        "def get_init_inputs():\n    return [lo, hi, scale, -lo]\n"
    )
    assert "Init arguments: [-2, 2, -0.5, 2]" in facts.task_text(reference)


def test_the_vectorizer_report_is_the_shown_codes() -> None:
    """A prompt showing a tie's code gave the best's vectorizer report (its line numbers
    from another version)."""
    from dataclasses import replace

    best = replace(verdict(2.0), vectorizer="line 3 `for (i...)`: loop vectorized (BEST)")
    tie = replace(verdict(2.1), vectorizer="line 9 `for (k...)`: not vectorized (TIE)")
    text = facts.facts_block(backend="cpu", threads=1, reference=LINEAR, start=verdict(4.0),
                             best=best, best_step=2, shown=3, code=tie)  # fmt: skip
    assert "(TIE)" in text and "(BEST)" not in text
    alone = facts.facts_block(backend="cpu", threads=1, reference=LINEAR, start=verdict(4.0),
                              best=best, best_step=2)  # fmt: skip
    assert "(BEST)" in alone
