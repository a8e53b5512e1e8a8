"""The choice may answer `stop` (keep the best) once there is a result, and the memory
may call a run converged."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import make_provider
from htam_engine.memory import START, Outcome, load_seed
from htam_engine.policy import (
    OTHER,
    STOP,
    PolicyConfig,
    make_prefix,
    predicts_no_gain,
    select_global,
)
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import PathEntry, State

FEATURES = {"loops", "nested_loops", "no_simd", "no_restrict", "no_openmp", "low_opt"}


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def state(path: list[PathEntry]) -> State:
    return State("cpu", "reduction", "cpu:reduction:softmax", set(FEATURES), path=path)


def test_stop_is_offered_after_a_step_and_ends_with_its_reason(server: ScriptedAPIServer) -> None:
    server.script(Reply(text='{"local": "stop", "reason": "every candidate is a no-op here"}'))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    done = state([PathEntry("vectorization", "omp_simd", "improved")])
    decision = selector.choose(load_seed("cpu"), "vectorization", done, {})
    assert decision.local_id == STOP and decision.reason == "every candidate is a no-op here"
    sent = server.requests[0].body
    enum = sent["response_format"]["json_schema"]["schema"]["properties"]["local"]["enum"]
    assert STOP in enum and 'answer "stop"' in sent["messages"][1]["content"]


def test_another_direction_may_be_asked_for_and_sets_this_one_aside(
    server: ScriptedAPIServer,
) -> None:
    """A direction whose strategies are all no-ops on the code used to leave only `stop`."""
    from htam_engine.runnable import Runnable

    server.script(Reply(text='{"local": "other_direction", "reason": "all pragmas here"}'))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    graph = load_seed("cpu")
    decision = selector.choose(graph, "vectorization", state([]), {})
    assert decision.local_id == OTHER and decision.reason == "all pragmas here"
    sent = server.requests[0].body
    assert OTHER in sent["response_format"]["json_schema"]["schema"]["properties"]["local"]["enum"]
    runnable = Runnable(llm=True)
    runnable.set_aside.add(("vectorization", "code"))
    node = next(iter(graph.locals_of("vectorization")))
    why = runnable.why_not(node, state([]), "code")
    assert why is not None and "set aside" in why
    assert runnable.why_not(node, state([]), "other code") != why


def test_the_models_own_strategy_alone_offers_no_other_direction(
    server: ScriptedAPIServer,
) -> None:
    """Offered only its own strategy (nothing named left), a capable model answered
    "other_direction" for "a memory-oriented direction", and its GELU run ended "no
    applicable strategy" with 5 of 6 steps left: there is no other direction to ask for."""
    from htam_engine.vocabulary import OFFERS_USED_UP

    server.script(Reply(text='{"local": "own_strategy", "reason": "stream the output"}'))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    spent = state([PathEntry("open_direction", "own_strategy", "not_improved")])
    spent.features.add(OFFERS_USED_UP)
    decision = selector.choose(load_seed("cpu"), "open_direction", spent, {})
    assert decision.local_id == "own_strategy"
    sent = server.requests[0].body
    enum = sent["response_format"]["json_schema"]["schema"]["properties"]["local"]["enum"]
    assert OTHER not in enum and STOP in enum
    assert "No other direction is left" in sent["messages"][1]["content"]
    assert "other_direction" not in sent["messages"][1]["content"]


def test_stop_is_not_offered_before_the_first_step(server: ScriptedAPIServer) -> None:
    server.script(Reply(text='{"local": "stop", "reason": "lazy"}'))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    decision = selector.choose(load_seed("cpu"), "vectorization", state([]), {})
    assert decision.local_id != STOP and "evidence ranking used" in decision.reason
    enum = server.requests[0].body["response_format"]["json_schema"]["schema"]
    assert STOP not in enum["properties"]["local"]["enum"]


def test_stop_is_not_offered_while_pytorch_is_confirmed_faster(server: ScriptedAPIServer) -> None:
    """A capable model stopped an L2 norm at 0.87x PyTorch, "already at its limit":
    PyTorch's own time says it is not."""
    from htam_engine.vocabulary import BEHIND_REFERENCE

    server.script(Reply(text='{"local": "stop", "reason": "at its limit"}'))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    behind = state([PathEntry("vectorization", "omp_simd", "not_improved")])
    behind.features.add(BEHIND_REFERENCE)
    decision = selector.choose(load_seed("cpu"), "vectorization", behind, {})
    assert decision.local_id != STOP and "evidence ranking used" in decision.reason
    sent = server.requests[0].body
    enum = sent["response_format"]["json_schema"]["schema"]["properties"]["local"]["enum"]
    assert STOP not in enum and "PyTorch is confirmed faster" in sent["messages"][1]["content"]


def run(steps: int, speedup: float, status: str) -> tuple[bool, State]:
    """`steps` steps with the same outcome learned; whether the memory then says converged."""
    graph, path, rng = load_seed("cpu"), [], random.Random(0)
    config = PolicyConfig()
    for _ in range(steps):
        s = state(list(path))
        prefix = make_prefix(s.path, config.K)
        decision = select_global(graph, prefix, s, config, rng)
        local = next(
            n.id for n in graph.locals_of(decision.chosen) if n.fits(s.family, s.tags()) is None
        )
        reward = -0.5 if status != "improved" else 0.3
        graph.apply_outcome(Outcome("cpu", s.task_signature, prefix, decision.alphas,
                                    decision.chosen, local, status, True, True, speedup, 1.0,
                                    reward))  # fmt: skip
        path.append(PathEntry(decision.chosen, local, status))
    last = state(path)
    decision = select_global(graph, make_prefix(path, config.K), last, config, rng)
    return predicts_no_gain(decision, last), last


def test_the_memory_calls_a_run_converged_only_after_steps_that_kept_nothing() -> None:
    assert run(6, 0.9, "not_improved")[0]
    assert not run(2, 0.9, "not_improved")[0]  # too early to say
    assert not run(6, 1.3, "improved")[0]
    assert START  # the prefix starts there (make_prefix)


RECORDED = Path(__file__).parent / "fixtures" / "llm" / "frontier" / "softmax-facts-stop.jsonl"


def test_a_recorded_capable_model_stops_on_no_op_candidates(tmp_path: Path) -> None:
    """The run recorded against a capable answerer: its generation prompt carried the
    facts, and its last choice, offered only no-ops for the AVX2 kernel it had, was stop."""
    lines = RECORDED.read_text().splitlines()
    generate = next(json.loads(x) for x in lines if json.loads(x)["purpose"] == "generate")
    assert "## Facts" in generate["prompt"] and "1 thread(s)" in generate["prompt"]
    last = json.loads(lines[-1])
    assert last["purpose"] == "local" and "Valid ids: " in last["prompt"]
    cassette = tmp_path / "stop.jsonl"
    cassette.write_text(lines[-1] + "\n")
    provider, _ = make_provider("replay", cassette=cassette, env={})
    assert provider is not None
    tags = {"intrinsics", "vector_types", "loops", "opt_O3", "march_native", "no_restrict"}
    done = State("cpu", "reduction", "cpu:reduction:softmax", tags,
                 path=[PathEntry("algorithm_fusion", "fuse_passes", "improved")])  # fmt: skip
    decision = LLMLocalSelector(provider).choose(load_seed("cpu"), "scalar_efficiency", done, {})
    assert decision.local_id == STOP and "no-op" in decision.reason


GEMM = Path(__file__).parent / "fixtures" / "llm" / "frontier_gemm_translation.py"


def test_a_model_may_write_a_strategy_whose_rewrite_cannot_read_its_code() -> None:
    """A capable model's first GEMM (recorded: a transposed weight, an i-k-j nest through
    an accumulator row) is no nest the register-tiling and loop-tiling rewrites read: they
    were never offered to the model, which then filed its own micro-kernel under loop
    interchange. With a model they are offered (it writes them); offline they are not,
    with the rewrite's reason. A fused softmax is offered to no GEMM (a capable model was
    asked for one, twice)."""
    from htam_engine import parsing
    from htam_engine.runnable import Runnable

    source = GEMM.read_text()
    graph = load_seed("cpu")
    kernel = State("cpu", "fused", "cpu:fused:gemm", parsing.features(source, "cpu"))
    for wanted in ("register_tiling_cpu", "cache_block"):
        node = graph.locals[wanted]
        offline = Runnable(llm=False).why_not(node, kernel, source)
        assert offline is not None and not offline.startswith("does not fit"), offline
        assert Runnable(llm=True).why_not(node, kernel, source) is None
        assert not Runnable.rewrites(node, source)
    # a strategy whose rewrite is its only test of fit stays where that rewrite applies
    softmax = graph.locals["fused_softmax_vexp"]
    assert Runnable(llm=True).why_not(softmax, kernel, source) is not None
