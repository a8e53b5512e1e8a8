"""A model too slow for its deadline fails its step, not the run: the step records
`no_code` with the reason, nothing is learned from it, and after two such failures in a
row the run goes on with mechanical strategies and says so. Real loop, real verdicts,
against the tests' local API server, which here writes one token a second."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import RetryPolicy
from htam_engine.loop import LLM_FAILED, LoopConfig, Optimizer
from htam_engine.memory import MemoryStore
from htam_engine.task import load_task

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
SLOW = Reply(text="x " * 200, output_tokens=200, piece_delay_s=1.0)  # 1 token/s


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def test_a_stalling_model_fails_its_steps_and_the_run_goes_on_mechanically(
    server: ScriptedAPIServer, tmp_path: Path
) -> None:
    server.script(*[SLOW] * 40)
    retry = RetryPolicy(attempts=1, timeout_s=1.5, sleep=lambda _s: None)
    provider = sdk_provider("openai", server, retry=retry)
    shutil.copytree(ROOT / "examples" / "gelu", tmp_path / "gelu")
    task = load_task(tmp_path / "gelu" / "cpu_naive.py")
    store = MemoryStore()
    # every mechanical strategy that applies to gelu excluded: the steps go to the LLM,
    # and once it has failed twice nothing mechanical is left to go on with
    mechanical = ("opt_flags", "math_vectorization", "restrict_pointers")
    config = LoopConfig(steps=3, exclude=mechanical)
    result = Optimizer(task, task.impl_source or "", provider=provider, store=store,
                       config=config).run()  # fmt: skip
    assert result.stopped.startswith("no applicable strategy"), result.stopped
    first, second = result.steps
    for failed in (first, second):
        assert failed.status == "no_code" and failed.note.startswith(LLM_FAILED)
        assert "deadline" in failed.note and failed.reward == 0.0
    assert "mechanical strategies from now on" in second.note
    assert "mechanical strategies from now on" in result.note
    graph = store.graph("cpu")
    assert graph.locals[first.local_id].stats.attempts == 0  # nothing learned from it
    assert result.correct
