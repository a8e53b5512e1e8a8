"""`htam bench kernelbench` on real KernelBench problem files (sizes reduced)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.llm_api_server import Reply, Request, ScriptedAPIServer
from helpers.skips import require

from htam_engine import sweep
from htam_engine.errors import UserError

KERNELBENCH = Path(__file__).parent / "fixtures" / "kernelbench"
TRANSLATION = Path(__file__).parent / "fixtures" / "loop" / "relu_translation.py"


def result(key: str, correct: bool, speedup: float | None) -> sweep.ProblemResult:
    return sweep.ProblemResult(key, 1, 1, "done", correct, speedup, None, 1, 0, 0.0)


def test_discovers_levels_and_selects_ids() -> None:
    problems = sweep.discover(KERNELBENCH)
    assert [p.key for p in problems if p.level == 1] == [
        "level1/1_Square_matrix_multiplication_",
        "level1/19_ReLU",
        "level1/23_Softmax",
    ]
    assert {p.level for p in problems} == {1, 2, 3}
    chosen = sweep.select(problems, [1], sweep.parse_ids("1-18,23"))
    assert [p.id for p in chosen] == [1, 23]
    assert sweep.discover(KERNELBENCH / "level3") == [p for p in problems if p.level == 3]


@pytest.mark.parametrize("spec", ["a-3", "1-", "1,,2", "3-x"])
def test_a_bad_problem_list_is_a_user_error(spec: str) -> None:
    with pytest.raises(UserError, match="--problems"):
        sweep.parse_ids(spec)


def test_metrics_count_every_problem_in_the_denominator() -> None:
    results = [
        result("a", True, 2.5),
        result("b", True, 1.2),
        result("c", True, 0.5),
        result("d", False, None),
    ]
    m = sweep.metrics(results)
    assert m["problems"] == 4
    assert m["fast_0"] == 0.75
    assert (m["fast_1"], m["fast_1.5"], m["fast_2"]) == (0.5, 0.25, 0.25)
    assert math.isclose(m["geomean_correct"], (2.5 * 1.2 * 0.5) ** (1 / 3))
    assert math.isclose(m["geomean_all"], (2.5 * 1.2 * 0.5 * 1.0) ** (1 / 4))


def test_offline_sweep_starts_a_bare_problem_mechanically_and_resumes(tmp_path: Path) -> None:
    """Without a model a bare problem starts from naive C++ written from its reference."""
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "htam_engine.cli", "bench", "kernelbench", str(KERNELBENCH)]
    argv += ["--level", "1", "--problems", "19", "--provider", "offline", "--device", "cpu"]
    argv += ["--steps", "1", "--out", str(out), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["metrics"]["problems"] == 1 and summary["metrics"]["fast_0"] == 1.0
    (problem,) = summary["problems"]
    assert problem["status"] == "done", problem
    first = (out / "level1" / "19_ReLU" / "result.json").stat().st_mtime_ns
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["metrics"] == summary["metrics"]
    assert (out / "level1" / "19_ReLU" / "result.json").stat().st_mtime_ns == first


def test_offline_sweep_says_which_op_it_cannot_write(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "htam_engine.cli", "bench", "kernelbench", str(KERNELBENCH)]
    argv += ["--level", "3", "--problems", "35", "--provider", "offline", "--device", "cpu"]
    done = subprocess.run([*argv, "--out", str(out), "--json"], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (problem,) = json.loads(done.stdout)["problems"]
    assert problem["status"] == "no_start" and "aten.randn" in problem["message"]
    assert "ModelNew" in problem["message"]  # what the user can do instead
    assert "| level3/35_LSTM | no_start |" in (out / "summary.md").read_text()


def test_problems_run_as_tasks_on_a_local_ray_cluster(tmp_path: Path) -> None:
    require(None if importlib.util.find_spec("ray") else "ray is not installed (htam-lsp[ray])")
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "htam_engine.cli", "bench", "kernelbench", str(KERNELBENCH)]
    argv += ["--level", "3", "--provider", "offline", "--out", str(out), "--ray", "local"]
    argv += ["--steps", "1"]  # the MLP now starts offline: one step is enough to dispatch
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = [p["key"] for p in json.loads(done.stdout)["problems"]]
    assert keys == ["level3/1_MLP", "level3/35_LSTM"]
    assert all((out / key / "result.json").is_file() for key in keys)


class Translator(ScriptedAPIServer):
    """Writes a first ModelNew for a bare problem; picks the first strategy offered."""

    def _next(self, request: Request) -> Reply:
        prompt = request.body["messages"][-1]["content"]
        if "first, correct custom-kernel implementation" in prompt:
            return Reply(text=f"```python\n{TRANSLATION.read_text()}```")
        offered = [line[4:].strip() for line in prompt.splitlines() if line.startswith("### ")]
        return Reply(text=json.dumps({"local": offered[0], "reason": "first listed"}))


def test_a_bare_problem_is_translated_first_then_replayed_in_a_sweep(tmp_path: Path) -> None:
    problem = KERNELBENCH / "level1" / "19_ReLU.py"
    cassette = tmp_path / "relu.jsonl"
    with Translator() as server:
        done = subprocess.run(
            [sys.executable, "-m", "htam_engine.cli", "optimize", str(problem), "--json",
             "--provider", "openai", "--base-url", f"{server.url}/v1", "--record", str(cassette),
             "--device", "cpu", "--steps", "1", "--output", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    translation = result["translation"]
    assert translation["local"] == "translate" and translation["verdict"]["correct"]
    assert result["correct"] and result["ref_speedup"] > 0

    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "htam_engine.cli", "bench", "kernelbench", str(KERNELBENCH)]
    argv += ["--level", "1", "--problems", "19", "--provider", "replay", "--cassette"]
    argv += [str(cassette), "--steps", "1", "--device", "cpu", "--out", str(out), "--json"]
    swept = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert swept.returncode == 0, swept.stderr[-2000:]
    summary = json.loads(swept.stdout)
    assert summary["metrics"]["fast_0"] == 1.0, summary["problems"]
    assert summary["problems"][0]["speedup"] > 0


def test_a_triton_form_problem_is_swept_and_counted_correct_untimed(tmp_path: Path) -> None:
    """KernelBench's Triton form (a `@triton.jit` ModelNew) on a CPU: verified under the
    interpreter, not timed; it counts in the correct rate and nowhere faster."""
    require(None if importlib.util.find_spec("triton") else "triton is not installed")
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "htam_engine.cli", "bench", "kernelbench"]
    argv += [str(KERNELBENCH.parent / "kernelbench_triton"), "--provider", "offline"]
    argv += ["--steps", "1", "--device", "cpu", "--out", str(out), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    (problem,) = summary["problems"]
    assert problem["key"] == "level1/19_ReLU" and problem["correct"]
    assert problem["speedup"] is None and "Triton" in problem["message"]
    m = summary["metrics"]
    assert (m["fast_0"], m["fast_1"], m["untimed"], m["geomean_all"]) == (1.0, 0.0, 1, 1.0)
    assert "| level1/19_ReLU | correct, untimed |" in (out / "summary.md").read_text()
