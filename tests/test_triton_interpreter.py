"""Triton candidates on a CPU: the interpreter really runs them (correct ones match the
reference, a wrong one does not), autotuned ones too, and the evaluator's Triton pieces
(environment, install message, timing note, launch check) say what they promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from test_examples_cpu import EXAMPLES

from htam_engine import triton_backend
from htam_engine.strategies import REGISTRY
from htam_engine.triton_backend import INSTALL_HINT, NOT_TIMED

# Shapes that do not divide the examples' blocks, so every mask is exercised.
SHAPES = {"gelu": [(3, 1000)], "softmax": [(5, 3000)], "matmul": [(100, 70), (70, 90)]}
RUNNER = """
import contextlib, importlib.util, json, sys

import torch
from htam_engine import triton_backend

NUMPY_CALLS = []


def probe(frame, event, arg):  # like the evaluator's library probe
    if event == "call" and "/numpy/" in frame.f_code.co_filename:
        NUMPY_CALLS.append(frame.f_code.co_name)


@contextlib.contextmanager
def paused():
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(previous)


if sys.argv[1] != "bare":
    triton_backend.prepare_interpreter(unwatched=paused if sys.argv[1] == "paused" else None)


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
    sys.setprofile(probe)
    actual = model(*inputs)
    sys.setprofile(None)
    errors[path] = ((actual - expected).abs().max() / expected.abs().max()).item()
print(json.dumps({"errors": errors, "numpy_calls": len(NUMPY_CALLS)}))
"""


def run_candidates(task: str, sources: dict[str, str], folder: Path) -> dict[str, float]:
    """The max error of each candidate source against the task's reference (relative to
    the reference's largest value), run by Triton's interpreter in a fresh process with
    the evaluator's Triton environment."""
    return interpret(task, sources, folder, "prepared")["errors"]


def interpret(task: str, sources: dict[str, str], folder: Path, mode: str) -> dict[str, Any]:
    """The runner's report: `errors` by label and the `numpy_calls` a profile hook like
    the evaluator's library probe saw during the calls."""
    done, paths = _interpret(task, sources, folder, mode)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    errors = {label: report["errors"][str(path)] for label, path in paths.items()}
    return {"errors": errors, "numpy_calls": report["numpy_calls"]}


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


def test_launches_run_outside_the_library_probe_when_the_worker_asks(tmp_path: Path) -> None:
    source = {"naive": (EXAMPLES / "gelu" / "triton_naive.py").read_text()}
    watched = interpret("gelu", source, tmp_path, "prepared")
    assert watched["numpy_calls"] > 0  # the interpreter computes with numpy
    paused = interpret("gelu", source, tmp_path, "paused")
    assert paused["numpy_calls"] == 0 and paused["errors"]["naive"] < 1e-4


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


def test_kernels_and_grids_may_call_only_triton() -> None:
    source = (EXAMPLES / "gelu" / "triton_naive.py").read_text()
    body = "y = 0.5 * x * (1.0 + tl.erf(x * 0.70710678118654752))"
    grid = 'lambda meta: (triton.cdiv(n, meta["BLOCK"]),)'
    assert body in source and grid in source
    for task in SHAPES:
        tuned = REGISTRY["triton.autotune"].apply((EXAMPLES / task / "triton_naive.py").read_text())
        assert triton_backend.foreign_calls(tuned) == ""
    cheats = {
        body: "y = torch.nn.functional.gelu(x) + np.zeros(1)",
        "mask = offsets < n": "mask = offsets < n\n    exp = np.exp\n    x = exp(x)",
        grid: 'lambda meta: (work(x), triton.cdiv(n, meta["BLOCK"]))',
    }
    found = [triton_backend.foreign_calls(source.replace(*pair)) for pair in cheats.items()]
    assert found == [
        "line 15: torch.nn.functional.gelu; line 15: np.zeros",
        "line 15: exp",
        "line 27: work",
    ]
    fine = source.replace("mask = offsets < n", "mask = (offsets < n).to(tl.int1)")
    fine = "from triton.language.extra import libdevice\n" + fine.replace("tl.erf", "libdevice.erf")
    assert triton_backend.foreign_calls(fine) == ""
