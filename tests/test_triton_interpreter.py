"""Triton candidates on a CPU: the interpreter really runs them (correct ones match the
reference, a wrong one does not), autotuned ones too, and the evaluator's Triton pieces
(environment, install message, timing note, launch check) say what they promise."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.examples import EXAMPLES
from helpers.triton import SHAPES, interpret, interpret_process, run_candidates

from htam_engine import triton_backend
from htam_engine.evaluate import runner
from htam_engine.evaluate.static import static_checks
from htam_engine.evaluate.verdict import Check
from htam_engine.strategies import REGISTRY
from htam_engine.triton_backend import INSTALL_HINT, NOT_TIMED


def test_autotuned_candidates_need_the_prepared_interpreter(tmp_path: Path) -> None:
    tuned = REGISTRY["triton.autotune"].apply((EXAMPLES / "gelu" / "triton_naive.py").read_text())
    bare, _ = interpret_process("gelu", {"tuned": tuned}, tmp_path, "bare")
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


def test_the_evaluator_refuses_a_triton_candidate_that_launches_no_kernel() -> None:
    reference = (EXAMPLES / "gelu" / "reference.py").read_text()
    naive = (EXAMPLES / "gelu" / "triton_naive.py").read_text()
    unlaunched = naive.split("class ModelNew")[0] + (
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    )

    def launch(source: str, backend: str) -> Check | None:
        checks = static_checks(source, "py", reference, backend=backend)
        return next((c for c in checks if c.name == "static.triton_launch"), None)

    assert launch(naive, "triton") == Check("static.triton_launch", True, "")
    refused = launch(unlaunched, "triton")
    assert refused is not None and not refused.passed and "never launched" in refused.detail
    assert launch(unlaunched, "cuda") is None  # the rule is Triton's
    assert runner._kind("static.triton_launch") == "not_custom_kernel"


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
