"""Replayed records of a capable model answering HTAM's real requests on KernelBench
problems (tests/fixtures/llm/frontier/kernelbench, `htam optimize --record`, see its
README): the prompts carry the facts issue 47 asked for (input shapes, every figure with
its interval, times and the current code in choice prompts, the chooser's reason in the
next code prompt, register tiling offered for a GEMM), and every code answer the model
wrote is read as a candidate."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from htam_engine.llm import extract_candidate

RECORDS = Path(__file__).parent / "fixtures" / "llm" / "frontier" / "kernelbench"
CASSETTES = sorted(RECORDS.glob("*.jsonl"))
CODE = ("translate", "generate", "repair")
WITH_FACTS = ("translate", "generate")  # a repair's facts came after these records
FIGURE = re.compile(r"(\d+(?:\.\d+)?x)( \(95 % [\d.]+-[\d.]+\))? over PyTorch")
VALID = re.compile(r"^Valid ids: (.*)$", re.M)


def calls(cassette: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cassette.read_text(encoding="utf-8").splitlines()]


def test_records_of_both_arms_and_every_problem_are_here() -> None:
    names = {c.stem for c in CASSETTES}
    arms = {name.split("-", 1)[0] for name in names}
    assert arms == {"htam", "flat"} and len(names) >= 8, names


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_every_code_prompt_names_the_input_shapes_and_every_figure_its_interval(
    cassette: Path,
) -> None:
    for call in calls(cassette):
        if call["purpose"] not in WITH_FACTS:
            continue
        prompt = call["prompt"]
        inputs = re.search(r"^Inputs \(contiguous, on the device\): (.*)$", prompt, re.M)
        assert inputs and "unknown" not in inputs.group(1) and "float32[" in inputs.group(1)
        assert "'?'" not in prompt.split("Init arguments:", 1)[1].splitlines()[0]
        for figure, interval in FIGURE.findall(prompt):
            assert interval, f"{figure} over PyTorch without its interval"


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_choice_prompts_carry_the_times_and_the_code_and_the_reason_reaches_the_code_prompt(
    cassette: Path,
) -> None:
    recorded = calls(cassette)
    for number, call in enumerate(recorded):
        if call["purpose"] != "local":
            continue
        prompt = call["prompt"]
        assert "PyTorch reference:" in prompt and "[REDACTED]" not in prompt
        assert "class ModelNew" in prompt.split("## Current implementation", 1)[1]
        chosen = json.loads(call["text"])
        following = recorded[number + 1] if number + 1 < len(recorded) else None
        if following is not None and following["purpose"] == "generate":
            assert chosen["reason"][:40] in following["prompt"]


def test_a_gemm_is_offered_register_tiling_by_the_memory() -> None:
    """The HTAM arm's choices (flat retrieval asks no chooser) for the GEMM problems."""
    gemms = [
        c for c in CASSETTES if c.stem.startswith("htam-") and re.search("Gemm|Matmul", c.stem)
    ]
    assert gemms
    for cassette in gemms:
        offered = " ".join(VALID.findall(" ".join(c["prompt"] for c in calls(cassette))))
        assert "register_tiling_cpu" in offered, cassette.stem


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_every_code_answer_is_read_as_a_candidate(cassette: Path) -> None:
    for call in calls(cassette):
        if call["purpose"] in CODE:
            answer = extract_candidate(call["text"], "python", truncated=call["truncated"])
            assert answer.code is not None, answer.reason
            assert "class ModelNew" in answer.code


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_the_models_own_code_is_shown_whole_when_it_chooses_next(cassette: Path) -> None:
    """The recorded choice prompts cut the model's hand-vectorized GEMM by up to 150
    lines: every code answer of these runs now fits both prompts whole."""
    from htam_engine.llm.prompts import generation_prompt, local_selection_prompt

    for call in calls(cassette):
        if call["purpose"] in CODE:
            code = extract_candidate(call["text"], "python", truncated=call["truncated"]).code
            assert code is not None
            _, choice = local_selection_prompt("s", "g", [("a", "b")], current_code=code)
            _, generation = generation_prompt("t", code, "", "edit", None, [], "python")
            middle = code.strip().splitlines()[len(code.strip().splitlines()) // 2]
            for prompt in (choice, generation):
                assert "omitted to fit the prompt budget" not in prompt
                assert middle in prompt


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_no_strategy_that_is_a_no_op_on_the_models_intrinsics_is_offered(cassette: Path) -> None:
    """Both answerers were offered division, branch and fast-math strategies for their
    hand-vectorized kernels with no division, branch or libm call in a hot loop."""
    from htam_engine import parsing
    from htam_engine.memory import load_seed

    graph = load_seed("cpu")
    for call in calls(cassette):
        if call["purpose"] not in CODE:
            continue
        code = extract_candidate(call["text"], "python", truncated=call["truncated"]).code
        tags = parsing.features(code or "", "cpu") | {"opt_O3"}
        for strategy, needed in (("avoid_division", "loop_division"),
                                 ("branchless", "loop_branch")):  # fmt: skip
            fits = graph.locals[strategy].fits("reduction", tags) is None
            assert fits == (needed in tags), (strategy, sorted(tags))
        if "hand_vectorized" in tags:
            assert graph.locals["fast_math_flags"].fits("reduction", tags) is not None


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_the_models_own_strategy_alone_comes_without_another_direction(cassette: Path) -> None:
    """A model offered only its own strategy answered `other_direction` and its run ended
    "no applicable strategy" with 5 of 6 steps left."""
    for call in calls(cassette):
        for valid in VALID.findall(call["prompt"]) if call["purpose"] == "local" else []:
            ids = {i.strip() for i in valid.split(",")}
            if ids - {"stop", "other_direction"} == {"own_strategy"}:
                assert "other_direction" not in ids, valid


@pytest.mark.parametrize("cassette", CASSETTES, ids=lambda c: c.stem)
def test_code_prompts_say_what_is_verified_beyond_the_tasks_inputs(cassette: Path) -> None:
    """A model asked whether extremes and other sizes are tested."""
    for call in calls(cassette):
        if call["purpose"] in WITH_FACTS:
            assert "Beyond the task's inputs: one set scaled to reach |x|" in call["prompt"]


def test_a_loss_whose_output_is_one_float_is_not_offered_streaming_stores() -> None:
    """Both answerers were offered streaming stores for a hinge loss, twice."""
    losses = [c for c in CASSETTES if "Loss" in c.stem]
    assert losses
    for cassette in losses:
        offered = " ".join(c["prompt"] for c in calls(cassette) if c["purpose"] != "translate")
        assert "streaming_stores" not in offered, cassette.stem
