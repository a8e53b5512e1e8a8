"""`evaluate()`: one candidate, one verdict, decided outside the candidate's process.

Per evaluation a judge process (reference, inputs, comparison) and a worker process
(the only one that imports the candidate) start side by side, each in its own process
group; this process imports neither torch nor the candidate. Timing is serialized per
device with a file lock under the HTAM home; compiles run in parallel.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from htam_engine.cli import UserError
from htam_engine.evaluate import cache, excerpt
from htam_engine.evaluate.nvcc import cuda_source, nvcc_check
from htam_engine.evaluate.process import Child, Stop
from htam_engine.evaluate.static import static_checks
from htam_engine.evaluate.verdict import SUSPECT_SPEEDUP, Check, EvalError, Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.task import Task

DEVICES = ("auto", "cuda", "cpu")
MAX_TRIALS = 100
_UNCACHED = ("cancelled", "timeout")
_INCORRECT = frozenset({"output.shape", "output.dtype", "output.finite", "output.values"})


def gpu_available() -> bool:
    """True when the NVIDIA driver reports a GPU (checked without importing torch)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def resolve_device(device: str, task: Task) -> str:
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}: use one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if task.backend == "cuda" else "cpu"
    return device


def display_name(task: Task) -> str:
    if task.impl_path is not None:
        return task.impl_path.name
    return "candidate.cu" if task.kind == "cu" else "candidate.py"


def evaluate(
    task: Task,
    candidate_source: str,
    *,
    device: str = "auto",
    limits: Limits | None = None,
    use_cache: bool = True,
    cancel: threading.Event | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Verdict:
    """Compile, verify and time `candidate_source` against `task`'s reference."""
    limits = limits or Limits()
    resolved = resolve_device(device, task)
    key = cache.key(task, candidate_source, resolved, limits)
    if use_cache and (hit := cache.get(key)) is not None:
        return hit
    verdict = _evaluate(
        task,
        candidate_source,
        resolved,
        limits,
        cancel or threading.Event(),
        on_phase or (lambda _phase: None),
    )
    if use_cache and (verdict.error is None or verdict.error.kind not in _UNCACHED):
        cache.put(key, verdict)
    return verdict


def _evaluate(
    task: Task,
    source: str,
    device: str,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
) -> Verdict:
    verdict = Verdict(device=device)
    verdict.checks = static_checks(source, task.kind, task.reference_source)
    failed = [check for check in verdict.checks if not check.passed]
    if failed:
        _fail(verdict, "cheating", failed, source)
        return verdict
    if device == "cuda" and not gpu_available():
        return _compile_only(task, source, verdict, limits)
    on_phase("compile")
    with _job_dir() as jobdir:
        _write_job(jobdir, task, source, device, limits)
        _run(jobdir, task, source, verdict, limits, cancel, on_phase)
    return verdict


def _fail(verdict: Verdict, kind: str, failed: list[Check], source: str) -> None:
    names = ", ".join(check.name for check in failed)
    detail = failed[0].detail
    line = excerpt.first_line_number(detail)
    verdict.error = EvalError(kind, f"{names}: {detail}"[:600], excerpt.around(source, line), line)
    verdict.correct = False


def _compile_only(task: Task, source: str, verdict: Verdict, limits: Limits) -> Verdict:
    """No GPU here: check that the CUDA code compiles with nvcc, then say why it stops."""
    code = cuda_source(source, task.kind)
    start = time.monotonic()
    if code is None:
        verdict.compiled = False
        message = "no GPU here, and no CUDA source found to compile-check"
    else:
        verdict.compiled, log = nvcc_check(code, limits.compile_s)
        if not verdict.compiled:
            verdict.phase_seconds["compile"] = time.monotonic() - start
            return _error(verdict, Stop("compile_error", "nvcc rejected the kernel", log), source)
        message = f"compiled with nvcc -arch=sm_80; no GPU here to run {display_name(task)}"
    verdict.phase_seconds["compile"] = time.monotonic() - start
    verdict.error = EvalError("no_gpu", message)
    return verdict


@contextlib.contextmanager
def _job_dir() -> Iterator[Path]:
    jobdir = Path(tempfile.mkdtemp(prefix="eval-", dir=subdir("jobs")))
    try:
        yield jobdir
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)


def _write_job(jobdir: Path, task: Task, source: str, device: str, limits: Limits) -> None:
    (jobdir / "candidate").mkdir()
    (jobdir / "reference.py").write_text(task.reference_source)
    name = display_name(task)
    (jobdir / "candidate" / name).write_text(source)
    seeds = secrets.SystemRandom().sample(range(2**31), limits.input_sets)  # distinct
    job = {
        "name": task.name,
        "kind": task.kind,
        "entry": task.entry,
        "device": device,
        "candidate_file": f"candidate/{name}",
        "seeds": seeds,
        "input_sets": len(seeds),
        "init_seed": secrets.randbelow(2**31),
        "max_trials": MAX_TRIALS,
    }
    (jobdir / "job.json").write_text(json.dumps(job))


def _env(jobdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HTAM_BUILD_DIR"] = str(jobdir / "build")
    env["TORCH_EXTENSIONS_DIR"] = str(jobdir / "torch_extensions")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(
    jobdir: Path,
    task: Task,
    source: str,
    verdict: Verdict,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
) -> None:
    memory = limits.memory_mb if verdict.device == "cpu" else None
    judge = Child("htam_engine.evaluate.judge", jobdir, _env(jobdir), jobdir / "judge.log", None)
    worker = Child(
        "htam_engine.evaluate.worker", jobdir, _env(jobdir), jobdir / "candidate.log", memory
    )
    try:
        _phases(judge, worker, verdict, limits, cancel, on_phase)
    except Stop as stop:
        _error(verdict, stop, source)
    finally:
        worker.kill()
        judge.kill()


def _timed(verdict: Verdict, phase: str, start: float) -> None:
    verdict.phase_seconds[phase] = round(time.monotonic() - start, 3)


def _phases(
    judge: Child,
    worker: Child,
    verdict: Verdict,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
) -> None:
    start = time.monotonic()
    worker.wait_for("compiled", limits.compile_s, "compile", cancel)
    verdict.compiled = True
    _timed(verdict, "compile", start)
    on_phase("verify")
    start = time.monotonic()
    judge.wait_for("prepared", limits.verify_s + limits.compile_s, "verify (reference)", cancel)
    worker.send("verify")
    verified = worker.wait_for("verified", limits.verify_s, "verify", cancel)
    judge.send("judge")
    judged = judge.wait_for("judged", limits.verify_s, "verify (judge)", cancel)
    _timed(verdict, "verify", start)
    checks = [Check(**c) for c in verified["checks"] + judged["checks"]]
    verdict.checks += checks
    verdict.inputs_checked = int(judged["sets"])
    failed = [check for check in checks if not check.passed]
    if failed:
        cheats = [check for check in failed if check.name not in _INCORRECT]
        raise Stop(
            "cheating" if cheats else "incorrect",
            "; ".join(f"{c.name}: {c.detail}" for c in (cheats or failed))[:600],
        )
    verdict.correct = True
    on_phase("time")
    with _timing_lock(verdict.device, cancel):
        start = time.monotonic()
        worker.send("time")
        timed = worker.wait_for("timed", limits.time_s, "time", cancel)
        _timed(verdict, "time", start)
    _record_timing(verdict, timed["ref"], timed["cand"])


@contextlib.contextmanager
def _timing_lock(device: str, cancel: threading.Event) -> Iterator[None]:
    """One timing at a time per device on this machine, across processes."""
    with (subdir("locks") / f"timing-{device}.lock").open("w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel.wait(0.05):
                    raise Stop("cancelled", "cancelled while waiting to time") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cv(samples: list[float]) -> float:
    return statistics.stdev(samples) / statistics.mean(samples) if len(samples) > 1 else 0.0


def _record_timing(verdict: Verdict, ref: list[float], cand: list[float]) -> None:
    verdict.samples = {"reference": ref, "candidate": cand}
    verdict.runtime_ms = statistics.median(cand)
    verdict.ref_runtime_ms = statistics.median(ref)
    verdict.spread = {
        "candidate_cv": _cv(cand),
        "reference_cv": _cv(ref),
        "candidate_min_ms": min(cand),
        "candidate_max_ms": max(cand),
    }
    if verdict.runtime_ms > 0:
        verdict.speedup = verdict.ref_runtime_ms / verdict.runtime_ms
        verdict.suspect = verdict.speedup > SUSPECT_SPEEDUP


def _error(verdict: Verdict, stop: Stop, source: str) -> Verdict:
    line = excerpt.line_from_log(stop.log, source) or stop.line
    message = stop.message
    if stop.kind == "compile_error" and stop.log:
        message = f"{message}\n{excerpt.first_error(stop.log)}".strip()
    verdict.error = EvalError(stop.kind, message[:1200], excerpt.around(source, line), line)
    verdict.correct = False
    return verdict
