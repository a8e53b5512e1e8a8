"""Triton candidates and their rewrites: which rewrites there are, and running candidates
with Triton's interpreter in a fresh process with the evaluator's Triton environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.examples import EXAMPLES
from helpers.skips import require
from htam_engine import triton_backend
from htam_engine.strategies import REGISTRY

TRITON_IDS = sorted(rid for rid in REGISTRY if rid.startswith("triton."))
TRITON_TASKS = ("gelu", "softmax", "matmul")  # the examples with a triton_naive.py


def chain(source: str) -> str:
    """Every Triton rewrite that applies, in id order, one after the other."""
    for rid in TRITON_IDS:
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    return source


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
    done, paths = interpret_process(task, sources, folder, mode)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    errors = {label: report["errors"][str(path)] for label, path in paths.items()}
    return {"errors": errors, "numpy_calls": report["numpy_calls"]}


def interpret_process(
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
