"""CUDA where it cannot run (`--device cpu`, or no GPU): compile-checked with nvcc only,
said plainly, no speedup; the CUDA is found where load_inline gets it (variables too); an
nvcc run over its limit is a timeout, never cached as a compile error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from htam_engine.evaluate import Limits, cache, evaluate, runner
from htam_engine.evaluate.nvcc import PRELUDE, NvccResult, cuda_source
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "cuda_cpu"
LOCAL = FIXTURES / "local_source.py"
QUICK = Limits(compile_s=30, verify_s=30, time_s=30)


def test_cuda_passed_through_variables_is_found() -> None:
    code = cuda_source(LOCAL.read_text(), "py")
    assert code is not None and code.startswith(PRELUDE)
    assert "__global__ void relu_kernel" in code and "torch::Tensor relu(" in code
    module_level = '''
import textwrap
from torch.utils.cpp_extension import load_inline
head = "#define N 4\\n"
body = textwrap.dedent("""
    __global__ void k(float* y) { y[0] = N; }
""")
cuda_src = head + body
ext = load_inline("x", "void f();", [cuda_src, "// second unit"], functions=["f"])
'''
    code = cuda_source(module_level, "py")
    assert code is not None and "#define N 4\n\n__global__ void k" in code
    assert code.endswith("// second unit")
    assert cuda_source("x = 1\n", "py") is None


def _cuda_task():
    task = load_task(LOCAL)
    assert task.impl_source is not None and task.backend == "cuda"
    return task, task.impl_source


def test_an_nvcc_timeout_is_a_timeout_and_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    task, source = _cuda_task()
    monkeypatch.setattr(
        runner,
        "nvcc_check",
        lambda code, s: NvccResult("timeout", f"ran over its limit of {s:g} s"),
    )
    verdict = evaluate(task, source, device="cpu", limits=QUICK)
    assert verdict.error is not None and verdict.error.kind == "timeout"
    assert not verdict.compiled and "limit of 30 s" in verdict.error.message
    assert cache.get(cache.key(task, source, "cpu", QUICK, sandbox=verdict.sandbox)) is None
    monkeypatch.setattr(runner, "nvcc_check", lambda code, s: NvccResult("compiled"))
    again = evaluate(task, source, device="cpu", limits=QUICK)
    assert not again.cached and again.error is not None and again.error.kind == "no_gpu"


def test_without_nvcc_it_says_nothing_was_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    task, source = _cuda_task()
    monkeypatch.setattr(runner, "nvcc_check", lambda code, s: NvccResult("absent", "no nvcc"))
    verdict = evaluate(task, source, device="cpu", limits=QUICK, use_cache=False)
    assert verdict.error is not None and verdict.error.kind == "no_gpu"
    assert "no nvcc" in verdict.error.message and not verdict.compiled
    assert verdict.speedup is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_eval_on_cpu_compile_checks_cuda_with_nvcc_and_times_nothing(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "htam_engine.cli", "eval", str(LOCAL), str(LOCAL)]
    done = subprocess.run(
        [*argv, "--device", "cpu", "--json"], capture_output=True, text=True, timeout=600
    )
    verdict = json.loads(done.stdout)
    assert verdict["error"]["kind"] == "no_gpu", verdict["error"]
    assert "local_source.py compiled with nvcc" in verdict["error"]["message"]
    assert "nothing timed" in verdict["error"]["message"]
    assert verdict["compiled"] and verdict["speedup"] is None and verdict["runtime_ms"] is None
    assert "CUDA_HOME" not in done.stdout + done.stderr
