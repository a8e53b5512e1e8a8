"""Triton candidates on a CPU: the interpreter really runs them (correct ones match the
reference, a wrong one does not), autotuned ones too, and the evaluator's Triton pieces
(environment, install message, timing note, launch check) say what they promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require
from test_examples_cpu import EXAMPLES

from htam_engine import triton_backend
from htam_engine.strategies import REGISTRY
from htam_engine.triton_backend import INSTALL_HINT, NOT_TIMED

# Shapes that do not divide the examples' blocks, so every mask is exercised.
SHAPES = {"gelu": [(3, 1000)], "softmax": [(5, 3000)], "matmul": [(100, 70), (70, 90)]}
RUNNER = """
import importlib.util, json, sys

import torch
from htam_engine import triton_backend

if sys.argv[1] == "prepared":
    triton_backend.prepare_interpreter()

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

reference_path, shapes, candidates = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
reference = load(reference_path, "reference")
torch.manual_seed(0)
inputs = [torch.randn(*shape) for shape in shapes]
expected = reference.Model(*reference.get_init_inputs())(*inputs)
errors = {}
for i, path in enumerate(candidates):
    model = load(path, f"candidate{i}").ModelNew(*reference.get_init_inputs())
    error = (model(*inputs) - expected).abs().max() / expected.abs().max()
    errors[path] = error.item()
print(json.dumps(errors))
"""


def run_candidates(task: str, sources: dict[str, str], folder: Path) -> dict[str, float]:
    """The max error of each candidate source against the task's reference (relative to
    the reference's largest value), run by Triton's interpreter in a fresh process with
    the evaluator's Triton environment."""
    done, paths = _interpret(task, sources, folder, "prepared")
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    return {label: errors[str(path)] for label, path in paths.items()}


def _interpret(
    task: str, sources: dict[str, str], folder: Path, mode: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    require(triton_backend.missing())
    paths = {}
    for label, source in sources.items():
        paths[label] = folder / f"{label.replace('.', '_')}.py"
        paths[label].write_text(source)
    env = {**os.environ, **triton_backend.environment("cpu", folder / "scratch")}
    argv = [mode, str(EXAMPLES / task / "reference.py"), json.dumps(SHAPES[task])]
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *argv, *map(str, paths.values())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, paths


def test_autotuned_candidates_need_the_prepared_interpreter(tmp_path: Path) -> None:
    tuned = REGISTRY["triton.autotune"].apply((EXAMPLES / "gelu" / "triton_naive.py").read_text())
    bare, _ = _interpret("gelu", {"tuned": tuned}, tmp_path, "bare")
    assert bare.returncode != 0 and "active drivers" in bare.stderr
    assert run_candidates("gelu", {"tuned": tuned}, tmp_path)["tuned"] < 1e-4


def test_the_interpreter_benchmark_never_runs_a_config() -> None:
    def fail() -> None:
        raise AssertionError("a config ran")

    assert triton_backend.first_config(fail, (0.5, 0.2, 0.8)) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("task", sorted(SHAPES))
def test_naive_triton_examples_are_correct_and_a_wrong_kernel_is_not(
    task: str, tmp_path: Path
) -> None:
    source = (EXAMPLES / task / "triton_naive.py").read_text()
    wrong = {
        "gelu": ("0.5 * x", "0.55 * x"),
        "softmax": ("tl.exp(x - m) / s", "tl.exp(x - m) / (2.0 * s)"),
        "matmul": ("rk[None, :] < K)", "rk[None, :] < K - 1)"),
    }[task]
    assert wrong[0] in source
    errors = run_candidates(task, {"naive": source, "wrong": source.replace(*wrong)}, tmp_path)
    assert errors["naive"] < 1e-4
    assert errors["wrong"] > 1e-2


def test_environment_interprets_off_a_gpu_and_keeps_caches_in_scratch(tmp_path: Path) -> None:
    cpu = triton_backend.environment("cpu", tmp_path)
    assert cpu["TRITON_INTERPRET"] == "1"
    assert Path(cpu["TRITON_CACHE_DIR"]).is_relative_to(tmp_path)
    assert Path(cpu["TRITON_HOME"]) == tmp_path
    assert "TRITON_INTERPRET" not in triton_backend.environment("cuda", tmp_path)


def test_only_interpreted_triton_goes_untimed() -> None:
    assert (
        triton_backend.timing_note("triton", "cpu") == NOT_TIMED == "not timed: Triton interpreter"
    )
    assert triton_backend.timing_note("triton", "cuda") is None
    assert triton_backend.timing_note("cpu", "cpu") is None
    assert triton_backend.timing_note("cuda", "cuda") is None
    assert "correctness only" in triton_backend.CORRECTNESS_ONLY


def test_missing_triton_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_backend.importlib.util, "find_spec", lambda name: None)
    assert INSTALL_HINT in (triton_backend.missing() or "")
    monkeypatch.setattr(triton_backend.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(triton_backend.importlib.metadata, "version", lambda name: "3.1.0+git")
    assert "3.1.0+git is too old" in (triton_backend.missing() or "")
    monkeypatch.setattr(triton_backend.importlib.metadata, "version", lambda name: "3.9.0")
    assert triton_backend.missing() is None


def test_a_candidate_must_launch_a_triton_kernel() -> None:
    for task in SHAPES:
        assert triton_backend.unlaunched((EXAMPLES / task / "triton_naive.py").read_text()) is None
    source = (EXAMPLES / "gelu" / "triton_naive.py").read_text()
    torch_only = source.split("class ModelNew")[0] + (
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.gelu(x)\n"
    )
    assert "gelu_kernel) are never launched" in (triton_backend.unlaunched(torch_only) or "")
    assert "no @triton.jit kernel" in (triton_backend.unlaunched("import torch\n") or "")
