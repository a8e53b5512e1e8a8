"""`htam optimize` flags that bound the LLM: budgets, best-of-k, and their exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.llm_api_server import ScriptedAPIServer

from htam_engine.memory import load_seed

ROOT = Path(__file__).resolve().parent.parent


def optimize(
    task: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "optimize", str(task), "--json", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip


# every mechanical strategy of the CPU seed (a spent budget leaves those free to run)
MECHANICAL = tuple(lid for lid, node in load_seed("cpu").locals.items() if node.mechanical)


def test_a_spent_budget_stops_the_run_before_any_call_and_exits_1(tmp_path: Path) -> None:
    folder = tmp_path / "softmax"
    shutil.copytree(ROOT / "examples" / "softmax", folder)
    with ScriptedAPIServer() as server:
        done = optimize(
            folder / "cpu_naive.py",
            "--provider", "openai", "--base-url", f"{server.url}/v1", "--device", "cpu",
            "--steps", "2", "--budget-tokens", "5", "--output", str(tmp_path / "out"),
            "--exclude", ",".join(MECHANICAL),  # the steps need the LLM: none is free
            env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
        requests = len(server.requests)
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["steps"] == [] and "budget" in result["stopped"]
    assert result["llm"]["budget"]["max_tokens"] == 5
    assert requests == 0


def test_bad_llm_bounds_are_user_errors_in_one_json_document(tmp_path: Path) -> None:
    task = ROOT / "examples" / "softmax" / "cpu_naive.py"
    for flags in (["--candidates", "0"], ["--budget-usd", "-1"]):
        done = optimize(task, "--provider", "offline", *flags)
        assert done.returncode == 2
        assert json.loads(done.stdout)["error"]["kind"] == "user_error"


def test_no_cache_times_the_start_afresh(tmp_path: Path) -> None:
    """With the start's verdict in the cache (an `htam eval` put it there), --no-cache
    still times the start again."""
    folder = tmp_path / "softmax"
    shutil.copytree(ROOT / "examples" / "softmax", folder)
    task, reference = folder / "cpu_naive.py", folder / "reference.py"
    command = [sys.executable, "-m", "htam_engine.cli", "eval", str(reference), str(task), "--json"]
    for _ in range(2):
        verdict = json.loads(subprocess.run(command, capture_output=True, text=True).stdout)
    assert verdict["cached"] or not verdict["converged"], "a settled verdict is read back"
    flags = ["--provider", "offline", "--device", "cpu", "--steps", "1", "--no-cache"]
    done = optimize(task, *flags, "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["start_verdict"]["cached"] is False
