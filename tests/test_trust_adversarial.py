"""Adversarial candidates, one per cheat class, each rejected by its named check; and the
honest set accepted. The trusted side must hold on its own, so most of these go straight
to `run_candidate` (past the static checks, as a candidate that evades them would)."""

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from htam_engine.evaluate import Limits, evaluate
from htam_engine.evaluate.runner import run_candidate, timing_threads
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Verdict
from htam_engine.task import load_task

CANDIDATES = Path(__file__).parent / "fixtures" / "candidates"
OLD_CHEATS = Path(__file__).parent / "fixtures" / "eval" / "cheats"
QUICK = Limits(compile_s=60, verify_s=30, time_s=60)


def measure(path: Path, source: str | None = None) -> Verdict:
    """The candidate at `path` through everything after the static checks."""
    task = load_task(path)
    source = source if source is not None else path.read_text()
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    return run_candidate(task, source, verdict, QUICK, threading.Event(), lambda _p: None)


def failed(verdict: Verdict) -> list[str]:
    return [check.name for check in verdict.checks if not check.passed]


def test_the_sandbox_is_bubblewrap_where_bwrap_is_installed():
    if shutil.which("bwrap") and os.environ.get("HTAM_SANDBOX") != "none":
        assert sandbox_mode() == "bwrap", (
            "bwrap is installed but cannot start a sandbox here (user namespaces?): "
            "evaluations would fall back to sandbox 'none'"
        )


@pytest.mark.parametrize(
    ("name", "kind", "check"),
    [
        ("forged_events", "cheating", "timing.call_count"),
        ("call_counter", "cheating", "timing.outputs"),
        # its wrong answers come where calls follow within 50 ms: in timing, or already
        # in verification when the judge's checks between those calls are that quick
        ("pace", ("cheating", "incorrect"), ("timing.outputs", "output.values")),
        ("flags", "incorrect", "output.values"),
        ("pointer_cache", "cheating", "output.fresh"),
        ("read_seeds", "incorrect", "output.values"),
        ("overwrite_inputs", "cheating", "output.inputs_unchanged"),
        ("numpy_work", "not_custom_kernel", "runtime.library"),
        ("dispatch_off", "not_custom_kernel", "runtime.torch_ops"),
        ("fp16_exp", "cheating", "precision.float64"),
        ("output_buffer", "cheating", "runtime.output_buffer"),
    ],
)
def test_adversarial_candidate_is_rejected_by_its_check(name, kind, check):
    verdict = measure(CANDIDATES / "adversarial" / f"{name}.py")
    assert not verdict.correct and verdict.error is not None
    kinds = (kind,) if isinstance(kind, str) else kind  # or one of these, each with its check
    assert verdict.error.kind in kinds, verdict.error
    check = check if isinstance(check, str) else check[kinds.index(verdict.error.kind)]
    assert check in failed(verdict), verdict.checks
    assert check in verdict.error.message
    assert "found the harness files" not in verdict.error.message


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("side_thread", "output.synchronous"),
        ("monkeypatch_timer", "runtime.monkeypatch"),
        ("torch_fallback", "runtime.torch_ops"),
        ("return_input", "runtime.aliasing"),
    ],
)
def test_cheats_the_static_checks_catch_are_caught_past_them_too(name, check):
    verdict = measure(OLD_CHEATS / f"{name}.py")
    assert not verdict.correct and verdict.error is not None
    assert check in failed(verdict), verdict.checks


def test_a_forged_result_never_reaches_the_caller():
    """It computes nothing and writes a 'correct, 5.99x' result into the judge's stdout
    (without bwrap) or whatever /proc lets it reach (with it: its own pipe)."""
    verdict = measure(CANDIDATES / "adversarial" / "forged_judge.py")
    assert not verdict.correct and verdict.error is not None and verdict.speedup is None
    expected = "timing.call_count" if sandbox_mode() == "bwrap" else "output.values"
    assert expected in failed(verdict), verdict.checks


def test_work_deferred_past_done_is_still_timed():
    verdict = measure(CANDIDATES / "adversarial" / "deferred_store.py")
    assert verdict.correct, verdict.error
    deferred_ms = 20.0  # what it sleeps after the harness marked `done`, every call
    assert verdict.runtime_ms is not None and verdict.runtime_ms > deferred_ms


def test_no_timed_input_is_ever_given_twice():
    """Verification gives input set 1 twice (`verify.deterministic`); timing never
    repeats an input, so a cache by value never answers a timed call."""
    verdict = measure(CANDIDATES / "adversarial" / "value_cache.py")
    assert verdict.correct, verdict.error
    assert len(verdict.samples["candidate"]) >= 10


def test_every_call_has_the_same_stack():
    """The stack walker works only while the stack matches the first (verified) call's:
    verified and timed calls are made from the same place, so it always works."""
    verdict = measure(CANDIDATES / "adversarial" / "stack.py")
    assert verdict.correct, verdict.error
    assert "timing.outputs" not in failed(verdict)


@pytest.mark.parametrize("name", ["plain", "openmp", "helper_table"])
def test_honest_candidate_is_accepted_with_every_check_passed(name):
    path = CANDIDATES / "honest" / f"{name}.py"
    verdict = evaluate(load_task(path), path.read_text(), device="cpu", limits=QUICK)
    assert verdict.error is None, verdict.error
    assert verdict.correct and verdict.speedup and not failed(verdict)
    assert verdict.sandbox == sandbox_mode() and verdict.threads == timing_threads()
    assert len(verdict.samples["candidate"]) >= 10


def test_sabotaging_torch_and_threads_in_the_candidate_cannot_slow_the_reference():
    verdict = measure(CANDIDATES / "adversarial" / "sabotage_vars.py")
    assert verdict.correct, verdict.error
    sleep_ms = 50.0  # what the replaced torch.softmax sleeps per call
    assert verdict.ref_runtime_ms is not None and verdict.ref_runtime_ms < sleep_ms / 2
    assert verdict.threads == timing_threads()


def test_a_burning_native_thread_is_seen_from_outside():
    """A thread past the policy's one is `timing.threads` from the judge's /proc books."""
    verdict = measure(CANDIDATES / "adversarial" / "burner.py")
    assert verdict.error is not None and verdict.error.kind == "cheating", verdict.error
    assert "timing.threads" in failed(verdict) and "2 tasks ran" in verdict.error.message
    assert verdict.speedup is None


def test_the_candidate_sees_no_key_and_cannot_write_the_htam_home(htam_home, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    monkeypatch.setenv("HTAM_PROVIDER_TOKEN", "secret")
    path = CANDIDATES / "adversarial" / "read_key.py"
    source = path.read_text().replace("{htam_home}", str(htam_home))
    verdict = measure(path, source)
    if sandbox_mode() == "bwrap":
        assert verdict.correct, verdict.error  # it raises if it got anything
        assert not (htam_home / "pwned").exists()
    else:
        assert verdict.error and "OPENAI_API_KEY" not in verdict.error.message
    assert "sk-test" not in str(verdict.to_json())


@pytest.mark.skipif(sandbox_mode() != "bwrap", reason="what only the sandbox closes")
def test_the_sandbox_closes_processes_network_and_the_file_system(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        path = CANDIDATES / "adversarial" / "escape_probe.py"
        port = str(server.getsockname()[1])
        source = path.read_text().replace("{port}", port).replace("{outside}", str(outside))
        verdict = measure(path, source)
    assert verdict.correct, verdict.error  # it raises with every way out that worked
    assert not list(outside.iterdir())


def test_the_editor_can_ask_for_the_sandbox_mode_without_torch():
    code = (
        "import sys\n"
        "from htam_engine.evaluate.sandbox import sandbox_mode\n"
        "print(sandbox_mode(), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [sandbox_mode(), "False"]


def test_a_log_a_worker_replaced_by_a_link_is_never_read_through_it(tmp_path):
    """A worker's log tail can reach a verdict; a worker could have linked it anywhere."""
    from htam_engine.evaluate.process import _tail

    secret = tmp_path / "secret.txt"
    secret.write_text("sk-test-from-a-file-only-the-judge-reads")
    log = tmp_path / "worker.log"
    log.write_text("x" * 2000 + "the end")
    assert _tail(log, 100).endswith("the end") and len(_tail(log, 100)) == 100
    log.unlink()
    log.symlink_to(secret)
    assert _tail(log, 100) == ""
