"""benchmarks/real_loop.py: the real `htam optimize` subprocess, summarized per phase."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_loop.py"


@pytest.mark.slow
def test_one_example_one_step_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "loop.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--steps", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    (run,) = data["arms"]["htam"]["runs"]
    assert "error" not in run, run["error"]
    assert len(run["steps"]) == 1 and len(run["phase_seconds"]) == 2  # start + one step
    start_phases = run["phase_seconds"][0]
    assert all(start_phases[p] > 0 for p in ("compile", "verify", "time"))
    summary = data["arms"]["htam"]["summary"]
    assert summary["candidates"] == 1 and 0 <= summary["correct_rate"] <= 1
    assert summary["geomean_start_over_pytorch"] is not None, run["start_error"]
    assert data["markdown"] in done.stdout


def test_bad_steps_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--steps must be at least 1" in done.stderr and "Traceback" not in done.stderr


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("real_loop_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tasks_are_the_examples_and_eight_kernelbench_starts() -> None:
    script = _script()
    bench = script.task_paths("cpu", "kernelbench")
    assert len(bench) >= 8 and all(p.name.endswith("_cpu.py") for p in bench)
    everything = script.task_paths("cpu", "all")
    assert everything[: len(everything) - len(bench)] == script.task_paths("cpu", "examples")
    assert {script.task_name(p) for p in everything} >= {"softmax", "19_ReLU_cpu"}


def test_a_win_is_confirmed_only_by_an_interval_above_one() -> None:
    script = _script()
    step = {"global": "g", "local": "l", "status": "improved", "speedup": 3.0, "correct": True}
    run = {
        "example": "t", "correct": True, "best_speedup": 3.0, "best_interval": [2.5, 3.5],
        "improved_steps": [1], "ref_speedup": 0.5, "start_ref_speedup": 0.2, "start_error": None,
        "steps": [step], "phase_seconds": [{}], "wall_s": 10.0, "best_source": "",
    }  # fmt: skip
    tie = {**run, "example": "u", "best_interval": [0.9, 1.2]}
    none = {**run, "example": "v", "improved_steps": [], "best_interval": None}
    arm = {"engine": ".", "selection": None, "runs": [run, tie, none]}
    arm["summary"] = script.aggregate(arm["runs"])
    assert arm["summary"]["confirmed_wins"] == 1
    table = script.markdown({"device": "cpu", "steps": 1, "seed": 0, "arms": {"htam": arm}})
    assert "3.00x (2.50-3.50)" in table and "| none |" in table


def test_the_best_is_placed_against_the_floor_and_the_old_floor() -> None:
    """The best's verdict (the kept step's, else the start's) read against the floor that
    counts special functions and the one of bytes and FLOPs alone."""
    script = _script()
    placed = {  # 8 MB at 4 GB/s: 2 ms of memory; the exps bind at 4 ms; run at 8 ms
        "fraction": 0.5, "roofline_ms": 4.0, "bytes": 8_000_000, "bandwidth_gbs": 4.0,
        "flops": 0, "peak_gflops": 100.0, "bound": "special",
    }  # fmt: skip
    result = {
        "best_step": 2, "start_verdict": {"roofline": {}},
        "steps": [{"step": 1, "verdict": {}}, {"step": 2, "verdict": {"roofline": placed}}],
    }  # fmt: skip
    fractions = script.floor_fractions(script.best_verdict(result))
    assert fractions["floor_fraction"] == 0.5
    assert fractions["old_floor_fraction"] == pytest.approx(0.25)
    assert script.floor_fractions(result["start_verdict"])["floor_fraction"] is None
    run = {"example": "t", "floor_fraction": 0.5, "old_floor_fraction": 0.25, "steps_used": 3,
           "stopped": "no applicable strategy", "floor_bound": "special"}  # fmt: skip
    arm = {"runs": [run], "summary": {"geomean_floor_fraction": 0.5}}
    table = script.floor_markdown({"steps": 6, "arms": {"htam": arm}})
    assert "| t | 50 % (special) / 25 % / 3 / no applicable strategy |" in table


def _run(task: str, best: float, *over_start: float) -> dict[str, Any]:
    steps = [
        {"status": "improved" if o > 1 else "not_improved", "over_start": o} for o in over_start
    ]
    return {"example": task, "best_speedup": best, "steps": steps}


def test_arms_are_compared_paired_by_task() -> None:
    """Evaluations to 1.5x count the start and only kept steps; the geomean ratio pairs each
    task's best under an arm with the first arm's; a failed run pairs with nothing."""
    script = _script()
    htam = [_run("a", 2.0, 1.2, 1.6), _run("b", 3.0, 3.0), _run("c", 1.0, 0.9)]
    flat = [_run("a", 1.0, 0.8, 0.9), _run("b", 1.5, 1.5), {"example": "c", "error": "x"}]
    arms = {"htam": {"runs": htam}, "flat": {"runs": flat}}
    c = script.compare_arms(arms, target=1.5)
    by_task = {row["task"]: row for row in c["rows"]}
    assert by_task["a"]["htam"]["evaluations_to_target"] == 3
    assert by_task["b"]["htam"]["evaluations_to_target"] == 2
    assert by_task["a"]["flat"]["evaluations_to_target"] is None
    assert by_task["c"]["flat"]["best"] is None
    assert c["reached"] == {"htam": 2, "flat": 1}
    versus = c["versus_base"]["flat"]
    assert versus["tasks"] == 2 and versus["geomean"] == pytest.approx(0.5)
    assert versus["low"] <= versus["geomean"] <= versus["high"]
    assert "`flat` over `htam`: geomean 0.50x" in script.comparison_markdown(c)


def test_arms_share_the_verdict_cache_but_not_the_memory(tmp_path: Path) -> None:
    script = _script()
    arms = script.parse_arms("htam,greedy", Path("."), before=tmp_path)
    assert [(a.name, a.selection) for a in arms] == [
        ("htam", "htam"),
        ("greedy", "greedy"),
        ("before", None),
    ]
    homes = [script.arm_home(tmp_path, arm) for arm in arms]
    assert len(set(homes)) == 3
    (homes[0] / "eval-cache" / "verdicts").write_text("v")
    assert (homes[1] / "eval-cache" / "verdicts").read_text() == "v"
    assert not (homes[1] / "memory.sqlite3").exists()
    assert script.parse_arms("htam", Path("."), None)[0].selection is None  # any engine
