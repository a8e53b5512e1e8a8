"""Code from the LLM over the wire: one generation, best-of-k in parallel, the repair
turn, and the checks that keep code that cannot run from ever being compiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.evaluate.verdict import Verdict
from htam_engine.llm import (
    LIMITS,
    Attempt,
    BudgetExhausted,
    LLMError,
    RunBudget,
    attempt,
    best_of,
    count_tokens,
    extract_candidate,
    failure_text,
    generate,
    generate_candidates,
    needs_repair,
    repair,
)
from htam_engine.llm.prompts import BUDGET

MODEL_NEW = (
    "import torch\n\nclass ModelNew(torch.nn.Module):\n"
    "    def forward(self, x):\n        return x * {n}\n"
)
CUDA = (
    '#include <cuda_runtime.h>\n__global__ void k(float* x) {{ x[0] = {n}.f; }}\nextern "C" '
    "void softmax_forward(float* x) {{ k<<<1, 1>>>(x); }}\n"
)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here you go:\n```{tag}\n{code}```\nDone."


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def test_a_generation_gives_code(server: ScriptedAPIServer) -> None:
    server.script(Reply(text=fenced(MODEL_NEW.format(n=2))))
    made = generate(sdk_provider("openai", server), "s", "p", "python")
    assert made.code == MODEL_NEW.format(n=2) and made.reason == ""
    assert made.completion is not None and made.to_json()["code"] is True
    assert server.requests[0].body["max_tokens"] == LIMITS["generate"].max_tokens


def test_a_generation_cut_off_in_the_class_is_no_code(server: ScriptedAPIServer) -> None:
    server.script(Reply(text="```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n"))
    server.replies[0].finish = "length"
    made = generate(sdk_provider("anthropic", server), "s", "p", "python")
    assert made.code is None
    assert "does not parse" in made.reason and "max_tokens" in made.reason


@pytest.mark.parametrize(
    ("text", "language", "entry", "reason"),
    [
        (fenced(CUDA.format(n=1), "cuda"), "cuda", "softmax_forward", ""),
        (fenced(CUDA.format(n=1), "cuda"), "cuda", "other_entry", "no function other_entry"),
        (fenced(MODEL_NEW.format(n=1)), "cuda", "softmax_forward", "the answer is python code"),
        (fenced(CUDA.format(n=1), "cuda"), "python", None, "the answer is cuda code"),
        (fenced("import torch\nclass ModelNew:\n    pass\n"), "python", None, "no forward"),
        (fenced("import torch\nclass Model:\n    def forward(self): ...\n"), "python", None, "no"),
        ("I would tile the loop.", "python", None, "no code in the answer"),
        (fenced("int f() { return 1; }\n", "cpp"), "cuda", None, "no __global__ kernel"),
    ],
)
def test_what_can_be_compiled(text: str, language: str, entry: str | None, reason: str) -> None:
    answer = extract_candidate(text, language, entry=entry)
    assert (answer.code is not None) is (reason == "")
    assert reason in answer.reason


def test_best_of_k_asks_k_times_in_parallel_and_keeps_the_order(
    server: ScriptedAPIServer,
) -> None:
    k = 3
    server.script(*(Reply(text=fenced(MODEL_NEW.format(n=n)), delay_s=0.3) for n in range(k)))
    made = generate_candidates(sdk_provider("openai", server, cache=True), "s", "p", "python", k=k)
    assert [m.sample for m in made] == list(range(k))
    assert {m.code for m in made} == {MODEL_NEW.format(n=n) for n in range(k)}
    assert len(server.requests) == k, "each sample is its own call, never a cached copy"
    assert server.max_in_flight == k


def test_a_failed_sample_is_kept_with_its_reason(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=400), Reply(text=fenced(MODEL_NEW.format(n=1))))
    provider = sdk_provider("openai", server)
    made = generate_candidates(provider, "s", "p", "python", k=2)
    assert sorted(m.code is None for m in made) == [False, True]
    failed = next(m for m in made if m.code is None)
    assert "LLM call failed" in failed.reason and "HTTP 400" in failed.reason


def test_when_every_sample_fails_the_llm_failed(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=401), Reply(status=401))
    with pytest.raises(LLMError, match="HTTP 401"):
        generate_candidates(sdk_provider("openai", server), "s", "p", "python", k=2)


def test_a_spent_budget_stops_best_of_k(server: ScriptedAPIServer) -> None:
    provider = sdk_provider("openai", server, budget=RunBudget(max_tokens=5))
    with pytest.raises(BudgetExhausted):
        generate_candidates(
            provider, "s", "a prompt that needs more than five tokens", "python", k=2
        )
    assert server.requests == []


def test_k_must_be_positive(server: ScriptedAPIServer) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        generate_candidates(sdk_provider("openai", server), "s", "p", "python", k=0)


def verdict(kind: str, excerpt: str = "", checks: list[dict[str, Any]] | None = None) -> Verdict:
    error = {"kind": kind, "message": f"{kind} happened", "excerpt": excerpt, "line": 7}
    data = {"compiled": kind != "compile_error", "correct": False, "error": error}
    return Verdict.from_json({**data, "checks": checks})


@pytest.mark.parametrize(
    ("kind", "repairable"),
    [
        ("compile_error", True),
        ("runtime_error", True),
        ("incorrect", True),
        ("not_custom_kernel", True),
        ("timeout", False),
        ("cheating", False),
        ("oom", False),
    ],
)
def test_which_failures_get_a_repair_turn(kind: str, repairable: bool) -> None:
    assert needs_repair(verdict(kind)) is repairable


def test_a_correct_verdict_needs_no_repair() -> None:
    assert needs_repair(Verdict(compiled=True, correct=True)) is False


def test_the_failure_text_has_the_excerpt_and_the_failed_checks() -> None:
    checks = [
        {"name": "outputs_match", "passed": False, "detail": "max abs error 0.31 at [3, 17]"},
        {"name": "inputs_unchanged", "passed": True, "detail": ""},
    ]
    text = failure_text(verdict("incorrect", "expected 1.0, got 0.69", checks))
    assert text.startswith("incorrect (line 7): incorrect happened")
    assert "expected 1.0, got 0.69" in text and "max abs error 0.31" in text
    assert "inputs_unchanged" not in text


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_repair_turn_shows_the_failure_and_asks_for_a_fixed_file(
    kind: str, server: ScriptedAPIServer
) -> None:
    log = 'k.cu(12): error: identifier "blockDimx" is undefined\n' * 2000  # a huge log
    failed = MODEL_NEW.format(n=1)
    server.script(Reply(text=fenced(MODEL_NEW.format(n=2))))
    fixed = repair(
        sdk_provider(kind, server),
        task_source="class Model: ...",
        failed_code=failed,
        verdict=verdict("compile_error", log),
        local_text="Shared-memory tiling",
        language="python",
        facts="in ModelNew, torch may only allocate, view, reshape",
    )
    assert fixed.code == MODEL_NEW.format(n=2) and fixed.purpose == "repair"
    body = server.requests[0].body
    assert body["max_tokens"] == LIMITS["repair"].max_tokens
    prompt = body["messages"][-1]["content"]
    assert 'identifier "blockDimx" is undefined' in prompt and failed.strip() in prompt
    assert "Shared-memory tiling" in prompt
    assert "## Facts\nin ModelNew, torch may only allocate" in prompt  # the rules a fix keeps
    assert count_tokens(prompt) < count_tokens(log) // 10
    assert count_tokens(prompt) < sum(BUDGET.values())


def judge(code: str) -> Verdict:
    return Verdict.from_json(judge_json(code))


def judge_json(code: str) -> dict[str, Any]:
    """A small real judge for these tests: run ModelNew.forward(3) against 3 * 2."""
    namespace: dict[str, Any] = {}
    try:
        exec(compile(code, "candidate.py", "exec"), namespace)  # noqa: S102 - test code
        got = namespace["ModelNew"]().forward(3)
    except Exception as error:  # noqa: BLE001 - any failure is the verdict
        error_json = {"kind": "runtime_error", "message": repr(error), "excerpt": "", "line": None}
        return {"compiled": True, "correct": False, "error": error_json, "checks": []}
    if got == 6:
        return {"compiled": True, "correct": True, "speedup": 1.0 + got / 100, "error": None}
    error_json = {"kind": "incorrect", "message": f"expected 6, got {got}", "excerpt": ""}
    return {"compiled": True, "correct": False, "error": error_json, "checks": []}


def run_attempt(server: ScriptedAPIServer, **kw: Any) -> Any:
    provider = kw.pop("provider", None) or sdk_provider("openai", server)
    first = generate(provider, "s", "p", "python")
    return attempt(
        provider, first, judge, task_source="ref", local_text="strategy", language="python", **kw
    )


def test_a_correct_first_answer_needs_no_repair(server: ScriptedAPIServer) -> None:
    server.script(Reply(text=fenced(MODEL_NEW.format(n=2))))
    result = run_attempt(server)
    assert result.verdict.to_json()["correct"] and not result.repaired
    assert len(server.requests) == 1


def test_a_wrong_result_is_repaired_from_the_mismatch(server: ScriptedAPIServer) -> None:
    server.script(
        Reply(text=fenced(MODEL_NEW.format(n=3))), Reply(text=fenced(MODEL_NEW.format(n=2)))
    )
    result = run_attempt(server)
    assert result.repaired and result.verdict.to_json()["correct"]
    assert result.code == MODEL_NEW.format(n=2)
    assert "expected 6, got 9" in server.requests[1].body["messages"][-1]["content"]
    assert result.to_json()["answers"][1]["purpose"] == "repair"


def test_a_repair_without_code_keeps_the_first_verdict(server: ScriptedAPIServer) -> None:
    server.script(Reply(text=fenced(MODEL_NEW.format(n=3))), Reply(text="Sorry, no idea."))
    result = run_attempt(server)
    assert result.repaired and result.code == MODEL_NEW.format(n=3)
    assert result.verdict.to_json()["error"]["kind"] == "incorrect"
    assert result.repair_note == "the repair gave no code: no code in the answer"


def test_a_spent_budget_skips_the_repair_with_a_note(server: ScriptedAPIServer) -> None:
    server.script(Reply(text=fenced(MODEL_NEW.format(n=3)), input_tokens=10, output_tokens=40))
    provider = sdk_provider("openai", server, budget=RunBudget(max_tokens=60))
    result = run_attempt(server, provider=provider)
    assert not result.repaired and result.repair_note.startswith("no repair turn: LLM budget spent")
    assert len(server.requests) == 1


def test_no_code_is_never_evaluated(server: ScriptedAPIServer) -> None:
    server.script(Reply(text="```python\nclass ModelNew(torch.nn.Module):\n```"))
    result = run_attempt(server)
    assert result.code is None and result.verdict is None
    assert result.reason.startswith("Python does not parse")


def test_the_repair_turn_can_be_off(server: ScriptedAPIServer) -> None:
    server.script(Reply(text=fenced(MODEL_NEW.format(n=3))))
    result = run_attempt(server, repair_turn=False)
    assert not result.repaired and not result.verdict.to_json()["correct"]


def test_best_of_keeps_the_fastest_correct_then_the_first_judged() -> None:
    def made(n: int | None) -> Attempt:
        code = MODEL_NEW.format(n=n) if n is not None else None
        return Attempt(code, judge(code) if code else None, "" if code else "no code", ())

    slow, wrong, empty = made(2), made(5), made(None)
    assert best_of([wrong, slow, empty]) is slow
    assert best_of([wrong, empty]) is wrong
    assert best_of([empty]) is None
    faster = Attempt(
        slow.code, Verdict.from_json({**judge_json(str(slow.code)), "speedup": 9.0}), "", ()
    )
    assert best_of([slow, faster]) is faster
