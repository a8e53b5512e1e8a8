"""`evaluate()`: one candidate, one verdict, decided outside the candidate's process.

Per evaluation this process (which imports neither torch nor the candidate) runs the
static checks, then starts a judge (trusted: it makes the inputs, computes the expected
outputs, times every call by its own clock and judges every output) that drives two
sandboxed workers, one for the reference and one for the candidate (see `judge`,
`worker`, `sandbox`). Only the judge's lines carrying this evaluation's token count.
The job folder is locked while it lives; folders of dead evaluations are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from htam_engine import machine, roofline, stats, triton_backend
from htam_engine.evaluate import builds, cache, excerpt, protocol, sandbox, standby, tasks
from htam_engine.evaluate.jobfolder import Started
from htam_engine.evaluate.jobspec import Asked, Conditions, JobSpec
from htam_engine.evaluate.nvcc import ARCH, cuda_source, nvcc_check
from htam_engine.evaluate.process import Child, Stop
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.static import static_checks
from htam_engine.evaluate.verdict import (
    SUSPECT_SPEEDUP,
    Check,
    ErrorKind,
    EvalError,
    Limits,
    Verdict,
)
from htam_engine.task import Task, allowed_ops, guess_backend
from htam_engine.vocabulary import TORCH_OP_GROUPS

MAX_TRIALS = 100
# The 95 % interval's half-width at which timing stops, relative to the speedup.
TARGET_HALF_WIDTH = {"cpu": 0.05, "cuda": 0.01}
# How much one kernel's speedup moves between evaluations, beyond what its pairs show:
# CPU, the coefficient of variation over 10 evaluations of examples/softmax/cpu_naive.py
# on a 2-core machine, idle and next to a busy neighbour (benchmarks/bench_noise.py:
# 0.045); GPU, the target of 1 % (not yet measured here: no GPU).
RUN_TO_RUN_CV = {"cpu": 0.045, "cuda": 0.01}
SIZE_S = 120.0  # a judge's start (a torch import) and the reference's run on meta tensors
LOCK_WAIT_S = 3600.0  # others' timings are bounded; waiting for them is no candidate's fault
# Not the candidate's doing: a reference that fails today (out of memory, a fixed bug)
# may run tomorrow, and a cancelled or timed-out evaluation said nothing.
_UNCACHED = (
    ErrorKind.CANCELLED,
    ErrorKind.TIMEOUT,
    ErrorKind.REFERENCE_ERROR,
    ErrorKind.EVALUATOR_ERROR,
)
_INCORRECT = frozenset(
    {
        "output.shape",
        "output.dtype",
        "output.finite",
        "output.values",
        "verify.wide_values",
        "verify.deterministic",
    }
)
_NOT_CUSTOM = frozenset(
    {"runtime.torch_ops", "runtime.library", "static.torch_compute", "static.triton_launch"}
)
_TORCH_USED = "runtime.allowed_torch_ops"  # the worker's word on the allowed ops it ran
_STATIC_CALL = re.compile(r"line \d+: (?P<call>[\w.]+)")


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
    incumbent: str | None = None,
    run: int = 0,
    decide: float | None = None,
    baseline: str = "eager",
) -> Verdict:
    """Compile, verify and time `candidate_source` against `task`'s reference (with
    `incumbent`, timed against that instead: `compare`). `run` n > 0 is the pair's
    n-th separate run, cached apart from the others. `decide`, the speedup the caller
    compares the result with: timing stops as soon as the interval lies wholly above or
    below it (`stats.settled`), and such a verdict is `converged` (the question is
    decided); the cache answers whatever was asked (a timing is one measurement).
    `baseline="compile"` adds the candidate timed against the torch.compile'd reference
    (`compile_baseline`)."""
    if baseline == "compile":
        options: dict[str, Any] = {
            "device": device, "limits": limits, "use_cache": use_cache, "cancel": cancel
        }  # fmt: skip
        eager = evaluate(task, candidate_source, on_phase=on_phase, decide=decide, **options)
        return versus_compile(task, candidate_source, eager, **options)
    limits = limits or Limits()
    resolved = machine.resolve_device(device, task.backend)
    mode = sandbox_mode()
    siblings = sandbox.named_siblings(task.impl_path, candidate_source)  # the box holds them
    content = cache.content(
        candidate_source, incumbent=incumbent, run=run, siblings=siblings, baseline=baseline
    )  # a structure, never a joined string: a sibling's text cannot pass for two
    key = cache.key(task, content, resolved, limits, sandbox=mode)  # policy too
    if use_cache and (hit := cache.get(key, sandbox=mode)) is not None:
        roofline.replace_on_kept(hit)  # on today's limits, as the fresh verdicts beside it
        return hit
    verdict = _evaluate(
        task,
        candidate_source,
        resolved,
        limits,
        cancel or threading.Event(),
        on_phase or (lambda _phase: None),
        incumbent,
        decide,
        baseline,
    )
    # Written even when not read: a re-measurement replaces the verdict it re-measured.
    if verdict.error_kind not in _UNCACHED:
        cache.put(key, verdict, sandbox=verdict.sandbox)
    return verdict


def compare(task: Task, candidate_source: str, incumbent_source: str, **options: Any) -> Verdict:
    """`candidate_source` verified against `task`'s reference but timed in pairs against
    `incumbent_source` (an implementation verified before), so `speedup` and `interval`
    are over the incumbent, from calls at the same moments. `options` are `evaluate`'s;
    the pair is cached as one content per `run`, so runs to pool are never one cached run
    read twice, and a run replayed from the cache retraces the same runs."""
    return evaluate(task, candidate_source, incumbent=incumbent_source, **options)


COMPILED = "compiled"  # the reference side runs torch.compile(Model) (`versus_compile`)


def versus_compile(task: Task, candidate_source: str, eager: Verdict, **options: Any) -> Verdict:
    """`eager` with `compile_baseline`: the candidate timed in pairs against the
    torch.compile'd reference in its own evaluation (compiled and warmed before timing,
    its compile time recorded apart). A compile that fails says so in
    `compile_baseline["error"]`; eager's numbers stand either way."""
    if eager.runtime_ms is None:
        return eager
    compiled = evaluate(task, candidate_source, baseline=COMPILED, **options)
    if compiled.interval is None or compiled.speedup is None:
        why = compiled.error.message if compiled.error else "not timed"
        eager.compile_baseline = {"error": why.removeprefix("the reference failed: ")[:600]}
        return eager
    eager.compile_baseline = {
        "speedup": compiled.speedup,
        "low": compiled.interval.low,
        "high": compiled.interval.high,
        "ref_runtime_ms": compiled.ref_runtime_ms,
        "compile_s": compiled.phase_seconds.get("reference_compile", 0.0),
        "converged": compiled.converged,
    }
    return eager


def pooled_interval(verdicts: list[Verdict]) -> stats.Interval:
    """One interval from timed verdicts of the same candidate (or pair) in separate runs:
    the run-to-run spread that widens each one shrinks as the runs are averaged."""
    runs = [
        (v.speedup, v.within_run_half_width, v.interval.pairs)
        for v in verdicts
        if v.speedup and v.interval and v.within_run_half_width is not None
    ]
    return stats.pooled(runs, RUN_TO_RUN_CV.get(verdicts[0].device, 0.0))


def _evaluate(
    task: Task,
    source: str,
    device: str,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
    incumbent: str | None = None,
    decide: float | None = None,
    baseline: str = "eager",
) -> Verdict:
    verdict = Verdict(device=device, sandbox=sandbox_mode())
    verdict.allow_torch = list(task.allow_torch)
    if task.scaled:
        verdict.scaled = {
            "factor": task.scale,
            "sizes": {name: [old, new] for name, old, new in task.scaled},
        }
    allowed = allowed_ops(task.allow_torch)
    verdict.checks = static_checks(source, task.kind, task.reference_source, allowed, task.backend)
    failed = [check for check in verdict.checks if not check.passed]
    if failed:
        kinds = {_kind(check.name) for check in failed}
        kind = ErrorKind.CHEATING if ErrorKind.CHEATING in kinds else kinds.pop()
        chosen = [c for c in failed if _kind(c.name) == kind]
        _fail(verdict, kind, chosen, source, task.allow_torch)
        return verdict
    return run_candidate(
        task, source, verdict, limits, cancel, on_phase, incumbent, decide, baseline
    )


def run_candidate(
    task: Task,
    source: str,
    verdict: Verdict,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
    incumbent: str | None = None,
    decide: float | None = None,
    baseline: str = "eager",
) -> Verdict:
    """Everything after the static checks: compile, verify and time in the sandbox (with
    `incumbent`, against it: `compare`). The trusted side must hold on its own when a
    candidate evades the static checks, so tests call this directly."""
    if (verdict.device == "cuda" and not machine.gpu_present()) or _cuda_on_cpu(
        task, source, verdict.device
    ):
        return _compile_only(task, source, verdict, limits)
    on_phase("compile")
    ahead = _ahead(task, verdict.device, limits)
    if baseline == COMPILED:
        ahead = replace(ahead, baseline=COMPILED)  # the reference worker compiles its model
    with standby.judge_for(ahead, task.reference_source) as started:
        boxes = _write_job(started, task, source, incumbent, decide)
        started.judge.send(protocol.JOB)
        passed: list[str] = []

        def phase(name: str) -> None:
            if name == "verify":  # compiled: both workers loaded, and stopped till called
                for box in boxes.values():
                    box.stage()
            passed.append(name)  # "time": verified correct
            on_phase(name)

        try:
            _phases(started.judge, task, verdict, limits, cancel, phase, decide)
        except Stop as stop:
            _error(verdict, stop, source)
        if baseline == COMPILED:
            _compile_seconds(verdict, started.jobdir / "reference" / "compiled.json")
        if work := roofline.read_work(started.jobdir / "work.json"):  # the judge counted it
            roofline.keep_work(task.reference_source, work)
    _keep_builds(verdict, boxes, verified="time" in passed)
    # implausibly faster than PyTorch; a duel's ratio is over the best so far (48x over a
    # naive loop nest is no cheat): there only the candidate's own verdict and light judge
    verdict.suspect = incumbent is None and (verdict.speedup or 0.0) > SUSPECT_SPEEDUP
    # against this machine's limits (the judge and its workers are gone: nothing runs beside)
    roofline.for_verdict(task.reference_source, verdict, incumbent is None, work)
    return verdict


def start_ahead(task: Task, device: str = "auto", limits: Limits | None = None) -> None:
    """Start now the judge the next evaluation of `task` on `device` takes (`standby`):
    its workers, its input sets and expected outputs."""
    standby.prefill(_ahead_of(task, device, limits), task.reference_source)


def size_problem(
    task: Task, device: str = "auto", limits: Limits | None = None, limit_s: float = SIZE_S
) -> protocol.Sized:
    """`task`'s sizes, measured by the judge that the next evaluation of `task` on `device`
    takes (`standby.size`; started now and held when none waits, so the caller can refuse
    the problem before any input set is made)."""
    return standby.size(_ahead_of(task, device, limits), task.reference_source, limit_s)


def judge_conditions(task: Task, device: str = "auto") -> Conditions:
    """What a judge for `task` on `device` is started under."""
    return _ahead_of(task, device, None).conditions


def _ahead_of(task: Task, device: str, limits: Limits | None) -> JobSpec:
    resolved = machine.resolve_device(device, task.backend)
    return _ahead(task, resolved, limits or Limits())


def _keep_builds(verdict: Verdict, boxes: dict[str, builds.Box], verified: bool) -> None:
    """Keep the builds of a candidate (and incumbent) `verified` correct (whatever its
    timing said); record which side reused its own earlier build (`builds`), and forget
    one that failed for the candidate's own reasons (its next evaluation compiles afresh)."""
    for role, box in boxes.items():
        if box.reused:
            verdict.builds[role] = "reused"
            if not verified and verdict.error_kind not in _UNCACHED:
                box.forget()
        elif verified and box.keep():
            verdict.builds[role] = "kept"
        else:
            box.drop()


def _compile_seconds(verdict: Verdict, path: Path) -> None:
    """The reference worker's torch.compile time (compile and warm-up, outside timing)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        verdict.phase_seconds["reference_compile"] = float(json.loads(path.read_text())["s"])


def _ahead(task: Task, device: str, limits: Limits) -> JobSpec:
    """All of a job that is known before its candidate: a judge started ahead prepares
    its workers, input sets and expected outputs from it."""
    return JobSpec(
        name=task.name,
        kind=task.kind,
        backend=task.backend,
        entry=task.entry,
        device=device,
        allow_torch=tuple(sorted(allowed_ops(task.allow_torch))),
        input_sets=limits.input_sets,
        max_trials=MAX_TRIALS,
        target_half_width=TARGET_HALF_WIDTH.get(device, 0.05),
        run_to_run_cv=RUN_TO_RUN_CV.get(device, 0.0),
        compile_s=limits.compile_s,
        verify_s=limits.verify_s,
        time_s=limits.time_s,
        memory_mb=limits.memory_mb,
        inputs_ahead_mb=limits.inputs_ahead_mb,
        threads=timing_threads(),
    )


def _fail(
    verdict: Verdict,
    kind: ErrorKind,
    failed: list[Check],
    source: str,
    policy: tuple[str, ...] = (),
) -> None:
    names = ", ".join(check.name for check in failed)
    detail = failed[0].detail
    line = excerpt.first_line_number(detail)
    message = f"{names}: {detail}"[:600]
    if kind == ErrorKind.NOT_CUSTOM_KERNEL:
        message += allow_hint(failed, policy)
    verdict.error = EvalError(kind, message, excerpt.around(source, line), line)
    verdict.correct = False


def allow_hint(failed: list[Check], policy: tuple[str, ...] = ()) -> str:
    """How to let torch do what made the candidate `not_custom_kernel` (its ops, as
    groups where a group holds them, added to the current `policy`: `--allow-torch`
    replaces it); numpy and other libraries cannot be allowed."""
    ops: list[str] = []
    for check in failed:
        if check.name == "runtime.torch_ops":
            ops += [op.strip() for op in check.detail.split(":", 1)[-1].split(",") if op.strip()]
        elif check.name == "static.torch_compute":
            ops += [m["call"].split(".")[-1] for m in _STATIC_CALL.finditer(check.detail)]
    if not ops:
        return " (only torch ops can be allowed, with --allow-torch: write this as a kernel)"
    named = [next((g for g, members in TORCH_OP_GROUPS.items() if op in members), op) for op in ops]
    wanted = list(dict.fromkeys([*policy, *named]))
    listed = ",".join(wanted)
    quoted = ", ".join(f'"{op}"' for op in wanted)
    return (
        f" (a library may do this only by permission: --allow-torch {listed}, or "
        f"[policy] allow_torch = [{quoted}] in htam.toml)"
    )


def _cuda_on_cpu(task: Task, source: str, device: str) -> bool:
    """A CUDA kernel asked to run on the CPU (`--device cpu`): it cannot."""
    return device == "cpu" and guess_backend(task.kind, source) == "cuda"


def _compile_only(task: Task, source: str, verdict: Verdict, limits: Limits) -> Verdict:
    """Where the kernel cannot run (no GPU here, or `--device cpu` for CUDA code): check
    that its CUDA code compiles with nvcc, then say plainly that nothing was timed. An
    nvcc run over its limit is a `timeout` (not cached, nothing is known of the code)."""
    where = (
        "no GPU here" if verdict.device == "cuda" else "a CUDA kernel does not run on --device cpu"
    )
    code = cuda_source(source, task.kind)
    start = time.monotonic()
    verdict.compiled = False
    if code is None:
        message = f"{where}, and no CUDA source found to compile-check: nothing compiled or timed"
    else:
        checked = nvcc_check(code, limits.compile_s)
        verdict.phase_seconds["compile"] = round(time.monotonic() - start, 3)
        if checked.status == "timeout":
            stop = Stop(ErrorKind.TIMEOUT, f"{where}: the nvcc compile check {checked.log}")
            return _error(verdict, stop, source)
        if checked.status == "rejected":
            stop = Stop(ErrorKind.COMPILE_ERROR, f"{where}: nvcc rejected the kernel", checked.log)
            return _error(verdict, stop, source)
        if checked.status == "absent":
            message = f"{where}, and no nvcc on PATH to compile-check it: nothing compiled or timed"
        else:
            verdict.compiled = True
            message = (
                f"{where}: {display_name(task)} compiled with nvcc -arch={ARCH} only (a "
                "compile check), nothing timed"
            )
    verdict.error = EvalError(ErrorKind.NO_GPU, message)
    return verdict


def _write_job(
    started: Started,
    task: Task,
    source: str,
    incumbent: str | None = None,
    decide: float | None = None,
) -> dict[str, builds.Box]:
    """The judge's job (outside any box) and each worker's box: the candidate's holds
    its file, the reference's the reference (or, comparing, the incumbent's file);
    neither holds seeds or inputs. A box holding code is seeded with that code's own
    earlier build, if kept (`builds`, under bwrap); its build box by role."""
    name = display_name(task)
    job = started.job
    assert job is not None, "a judge is given its task before its job"
    worker_job = job.worker()
    candidate_job = replace(worker_job, candidate_file=f"candidate/{name}")
    boxes = {}
    for role, code in (("candidate", source), ("reference", incumbent)):
        if code is not None:
            siblings = sandbox.named_siblings(task.impl_path, code)
            (started.jobdir / role / "candidate").mkdir()
            (started.jobdir / role / "candidate" / name).write_text(code)
            sandbox.place_siblings(siblings, started.jobdir / role / "candidate")
            (started.jobdir / role / "job.json").write_text(json.dumps(candidate_job.to_json()))
            if builds.enabled():
                key = builds.key(name, code, siblings, job.device)
                box = builds.Box(started.jobdir / role / builds.FOLDER, key)
                box.seed()
                boxes["candidate" if role == "candidate" else "incumbent"] = box
    if incumbent is None:
        (started.jobdir / "reference" / "reference.py").write_text(task.reference_source)
        (started.jobdir / "reference" / "job.json").write_text(json.dumps(worker_job.to_json()))
    count_work = roofline.kept_work(task.reference_source) is None
    asked = Asked(compare=incumbent is not None, decide=decide, count_work=count_work)
    (started.jobdir / "job.json").write_text(json.dumps(job.asking(asked).to_json()))
    return boxes


def timing_threads() -> int:
    """The thread count both sides run with: one. PyTorch's pool spin-waits for its
    threads, so next to a busy neighbour a 2-thread op's time jumps 10-100x while a
    1-thread op's holds (benchmarks/bench_threads.py; README, "What a measured number
    means"); a candidate's own OpenMP threads are its business, as its code's."""
    return 1


def _timed(verdict: Verdict, phase: str, start: float) -> None:
    verdict.phase_seconds[phase] = round(time.monotonic() - start, 3)


def _merge(verdict: Verdict, new: list[Check]) -> list[Check]:
    """Add `new` checks to the verdict's, by name (a failure is never replaced); the new
    failures."""
    by_name = {check.name: check for check in verdict.checks}
    for check in new:
        if check.name not in by_name or by_name[check.name].passed:
            by_name[check.name] = check
    verdict.checks = list(by_name.values())
    return [check for check in new if not check.passed]


def _judged(verdict: Verdict, task: Task, checks: list[Check]) -> list[Check]:
    """`_merge`, then the policy judged here: the allowed ops the worker says it ran are
    recorded in `torch_ops`, and a claim outside this side's policy is a forged report."""
    failed = _merge(verdict, checks)
    allowed = allowed_ops(task.allow_torch)
    for index, check in enumerate(verdict.checks):
        if check.name != _TORCH_USED:
            continue
        claimed = {op for op in check.detail.split(",") if op}
        outside = sorted(claimed - allowed)
        verdict.torch_ops = sorted(claimed & allowed)
        if outside and check.passed:
            forged = Check(_TORCH_USED, False, f"reports ops outside the policy: {outside}")
            verdict.checks[index] = forged
            failed.append(forged)
    return failed


def _raise_failed(failed: list[Check], policy: tuple[str, ...] = ()) -> None:
    if not failed:
        return
    kinds = [_kind(check.name) for check in failed]
    order = (ErrorKind.CHEATING, ErrorKind.NOT_CUSTOM_KERNEL)
    kind = next((k for k in order if k in kinds), ErrorKind.INCORRECT)
    chosen = [c for c, k in zip(failed, kinds, strict=True) if k == kind]
    message = "; ".join(f"{c.name}: {c.detail}" for c in chosen)[:600]
    if kind == ErrorKind.NOT_CUSTOM_KERNEL:
        message += allow_hint(chosen, policy)
    raise Stop(kind, message)


def _kind(name: str) -> ErrorKind:
    if name in _NOT_CUSTOM:
        return ErrorKind.NOT_CUSTOM_KERNEL
    return ErrorKind.INCORRECT if name in _INCORRECT else ErrorKind.CHEATING


def _phases(
    judge: Child,
    task: Task,
    verdict: Verdict,
    limits: Limits,
    cancel: threading.Event,
    on_phase: Callable[[str], None],
    decide: float | None = None,
) -> None:
    def answer(kind: type[protocol.M], limit_s: float, phase: str) -> protocol.M:
        return protocol.decode(judge.wait_for(kind.EVENT, limit_s, phase, cancel), kind)

    start = time.monotonic()
    compiled = answer(protocol.Compiled, limits.compile_s + limits.verify_s, "compile")
    verdict.compiled = True
    verdict.sandbox, verdict.vectorizer = compiled.sandbox, compiled.vectorizer
    _timed(verdict, "compile", start)
    on_phase("verify")
    start = time.monotonic()
    judge.send(protocol.VERIFY)
    verified = answer(protocol.Verified, limits.verify_s, "verify")
    _timed(verdict, "verify", start)
    verdict.inputs_checked = verified.sets
    failed = _judged(verdict, task, verified.checks)
    # a flag (`protocol.FLAGS`: right at the task's shape only) marks, never fails
    verdict.shape_only = any(check.name == protocol.SHAPE_ONLY for check in failed)
    _raise_failed([c for c in failed if c.name not in protocol.FLAGS], task.allow_torch)
    verdict.correct = True
    if note := triton_backend.timing_note(task.backend, verdict.device):
        verdict.note = note  # interpreter times say nothing about the kernel
        return
    on_phase("time")
    judge.send(protocol.TIME)
    answer(protocol.Timing, LOCK_WAIT_S, "the wait for the timing lock")
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    try:
        timed = answer(protocol.Timed, limits.time_s, "time")
    finally:
        _timed(verdict, "time", start)  # how long it held the timing lock, even if it failed
    verdict.threads = timed.threads
    _raise_failed(_judged(verdict, task, timed.checks), task.allow_torch)
    _record_timing(verdict, timed.ref, timed.cand)
    verdict.spread["harness_ms"] = timed.harness_ms
    verdict.spread.update(timed.accounting)  # what neighbours took (CPU)
    _record_conditions(verdict, load_before, TARGET_HALF_WIDTH.get(verdict.device, 0.05), decide)


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
    within = stats.paired_speedup(ref, cand)
    between = within.with_run_to_run(RUN_TO_RUN_CV.get(verdict.device, 0.0))
    verdict.speedup = within.estimate
    verdict.interval, verdict.within_run_half_width = between, within.half_width


def _record_conditions(
    verdict: Verdict, load_before: float, target: float, decide: float | None = None
) -> None:
    """How far the timing can be trusted: converged (narrow, or the question at `decide`
    decided: `spread["decided_at"]`), and the machine's load around it."""
    cores = len(os.sched_getaffinity(0))
    load = {"before": load_before, "after": os.getloadavg()[0], "cores": cores}
    if verdict.device == "cuda":
        load.update(gpu_clocks())
    verdict.load = load
    within = verdict.within_run_half_width
    narrow = within is not None and within <= target  # the pairs' own interval
    decided = verdict.interval is not None and _decided(verdict, decide) != 0
    if decided and decide is not None:
        verdict.spread["decided_at"] = decide
    verdict.converged = narrow or decided
    # No convergence, more runnable work than cores besides this timing, or more than a
    # tenth of the pairs left out (`tasks.over_policy`, disturbed): noisy.
    disturbed = verdict.spread.get("disturbed_share", 0.0) > tasks.TOLERATED_SHARE
    busy = max(load["before"], load["after"]) > cores
    verdict.noisy = not verdict.converged or busy or disturbed


def _decided(verdict: Verdict, decide: float | None) -> int:
    """`stats.decided` for a timed verdict's interval and its pairs (without them, as
    if they were not all on one side)."""
    assert verdict.interval is not None
    reference, candidate = (verdict.samples.get(side, []) for side in ("reference", "candidate"))
    one_sided = bool(reference) and stats.unanimous(reference, candidate, decide)
    return stats.decided(verdict.interval, decide, one_sided)


_GPU_QUERY = {
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "temperature.gpu": "temp_c",
}


def gpu_clocks() -> dict[str, float]:
    """The first visible GPU's clocks and temperature right after timing, where
    nvidia-smi reads them (a throttled GPU times slow)."""
    device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    command = ["nvidia-smi", f"--query-gpu={','.join(_GPU_QUERY)}", "-i", device]
    try:
        done = subprocess.run(
            [*command, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5
        )
        values = [float(v) for v in done.stdout.strip().split(",")]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    return dict(zip(_GPU_QUERY.values(), values, strict=False)) if done.returncode == 0 else {}


def _error(verdict: Verdict, stop: Stop, source: str) -> Verdict:
    line = excerpt.line_from_log(stop.log, source) or stop.line
    message = stop.message
    kind = stop.kind
    if kind == ErrorKind.COMPILE_ERROR and stop.log:
        message = f"{message}\n{excerpt.first_error(stop.log)}".strip()
    verdict.error = EvalError(kind, message[:1200], excerpt.around(source, line), line)
    verdict.correct = False
    return verdict
