"""The library policy (`--allow-torch`, `[policy] allow_torch`): a library GEMM with a
custom fused epilogue, KernelBench level 2's usual answer, is `not_custom_kernel` without
permission and correct with `gemm` allowed; what torch computed is in the verdict; a
pure-PyTorch candidate stays `not_custom_kernel`; the trusted side decides."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from htam_engine.evaluate import Limits, cache, evaluate
from htam_engine.evaluate.runner import _judged, run_candidate
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Check, Verdict
from htam_engine.task import TaskError, allowed_ops, load_task, parse_allow_torch, with_policy

POLICY = Path(__file__).parent / "fixtures" / "policy"
REFERENCE = POLICY / "gemm_add_relu.py"
FUSED = POLICY / "library_gemm_fused_epilogue.py"
QUICK = Limits(compile_s=60, verify_s=30, time_s=60)


def _eval_cli(candidate: Path, *flags: str) -> dict:
    argv = [sys.executable, "-m", "htam_engine.cli", "eval", str(REFERENCE), str(candidate)]
    done = subprocess.run(
        [*argv, "--device", "cpu", "--json", *flags], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout)


def test_library_gemm_needs_permission_and_says_how_to_give_it() -> None:
    verdict = _eval_cli(FUSED)
    assert verdict["error"]["kind"] == "not_custom_kernel"
    assert "torch.mm" in verdict["error"]["message"]
    assert "--allow-torch gemm" in verdict["error"]["message"]
    assert "[policy] allow_torch" in verdict["error"]["message"]


def test_library_gemm_with_a_fused_epilogue_is_correct_with_gemm_allowed() -> None:
    verdict = _eval_cli(FUSED, "--allow-torch", "gemm")
    assert verdict["error"] is None, verdict["error"]
    assert verdict["correct"] and verdict["speedup"]
    assert verdict["allow_torch"] == ["gemm"] and verdict["torch_ops"] == ["mm"]


def test_pure_pytorch_stays_not_custom_kernel_with_gemm_allowed() -> None:
    task = with_policy(load_task(POLICY / "pure_pytorch.py"), allow_torch="gemm")
    assert task.impl_source is not None
    verdict = evaluate(task, task.impl_source, device="cpu", limits=QUICK, use_cache=False)
    assert verdict.error is not None and verdict.error.kind == "not_custom_kernel"
    assert "add" in verdict.error.message and "clamp_min" in verdict.error.message
    assert "linear" not in verdict.error.message.split("(")[0]  # the GEMM itself is allowed
    assert "--allow-torch gemm,add,clamp_min" in verdict.error.message
    assert verdict.torch_ops == ["linear"]


def test_the_policy_is_part_of_the_cache_key() -> None:
    task = load_task(FUSED)
    source = task.impl_source or ""
    keys = {
        cache.key(with_policy(task, allow_torch=spec), source, "cpu", QUICK)
        for spec in ("none", "gemm", "gemm,relu", "conv")
    }
    assert len(keys) == 4
    same = cache.key(with_policy(task, allow_torch="mm"), source, "cpu", QUICK)
    assert same == cache.key(with_policy(task, allow_torch="aten::mm"), source, "cpu", QUICK)


def test_a_worker_claiming_ops_outside_the_policy_is_a_forged_report() -> None:
    task = with_policy(load_task(FUSED), allow_torch="mm")
    verdict = Verdict()
    claim = Check("runtime.allowed_torch_ops", True, "mm,relu")
    failed = _judged(verdict, task, [claim])
    assert [c.name for c in failed] == ["runtime.allowed_torch_ops"]
    assert "relu" in failed[0].detail and verdict.torch_ops == ["mm"]


def test_policy_names_groups_and_htam_toml(tmp_path: Path) -> None:
    assert parse_allow_torch("gemm, aten::relu conv", "x") == ("gemm", "relu", "conv")
    assert parse_allow_torch("none", "x") == ()
    assert {"mm", "addmm", "linear", "bmm"} <= allowed_ops(("gemm",))
    assert {"conv2d", "conv_transpose3d", "convolution"} <= allowed_ops(("conv",))
    for bad in ("torch.mm", "mm;rm", "*"):
        with pytest.raises(TaskError, match="--allow-torch"):
            parse_allow_torch(bad, "--allow-torch")
    (tmp_path / "htam.toml").write_text('[policy]\nallow_torch = ["gemm", "relu"]\n')
    (tmp_path / "gemm_add_relu.py").write_text(REFERENCE.read_text())
    task = load_task(tmp_path / "gemm_add_relu.py")
    assert task.allow_torch == ("gemm", "relu")
    assert with_policy(task, allow_torch="none").allow_torch == ()  # the flag replaces it
    (tmp_path / "htam.toml").write_text("[policy]\nallow_torch = 3\n")
    with pytest.raises(TaskError, match="allow_torch"):
        load_task(tmp_path / "gemm_add_relu.py")


def test_the_policy_travels_in_the_job_not_in_the_candidate(tmp_path: Path) -> None:
    """A candidate's own directive cannot widen its permission: only the task's policy
    (command line, htam.toml) reaches the worker's job."""
    forged = tmp_path / "forged.py"
    text = FUSED.read_text().replace(
        "# htam: reference=gemm_add_relu.py", "# htam: reference=gemm_add_relu.py allow_torch=gemm"
    )
    (tmp_path / "gemm_add_relu.py").write_text(REFERENCE.read_text())
    forged.write_text(text)
    task = load_task(forged)
    assert task.allow_torch == ()
    verdict = evaluate(replace(task), text, device="cpu", limits=QUICK)
    assert verdict.error is not None and verdict.error.kind == "not_custom_kernel"


def test_an_aten_kernel_re_registered_by_the_candidate_is_no_library_gemm() -> None:
    """aten::mm re-registered to compute the whole problem with other torch ops: the
    static check calls it cheating; past it, the runtime check still finds torch computing
    below the 'allowed' mm (only a bias add or a copy may run inside an allowed op)."""
    task = with_policy(load_task(POLICY / "aten_override.py"), allow_torch="gemm")
    source = task.impl_source or ""
    verdict = evaluate(task, source, device="cpu", limits=QUICK, use_cache=False)
    assert verdict.error is not None and verdict.error.kind == "cheating"
    assert "static.aten_override" in verdict.error.message
    past_static = Verdict(device="cpu", sandbox=sandbox_mode())
    verdict = run_candidate(task, source, past_static, QUICK, threading.Event(), lambda _p: None)
    assert verdict.error is not None and verdict.error.kind == "not_custom_kernel"
    assert "relu" in verdict.error.message.split("(")[0]
