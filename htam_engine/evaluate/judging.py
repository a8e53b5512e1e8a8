"""The judge's side of an evaluation, imported by `judge.main` once both workers are
starting (torch: its import then runs beside theirs): the reference, inputs and expected
outputs, the calls, verification and timing. See `judge` for what the judge is trusted
to do and how.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import math
import os
import secrets
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from htam_engine import kernels, roofline, stats
from htam_engine.evaluate import accounting, common, protocol, sandbox, tasks
from htam_engine.evaluate.jobspec import ROLES, Asked, JobSpec
from htam_engine.evaluate.process import (
    Stop,
    freeze,
    pin,
    quietest_core,
    thaw,
    timing_lock,
)
from htam_engine.evaluate.side import Side
from htam_engine.evaluate.verdict import Check, sets_ahead
from htam_engine.evaluate.wider import (
    DETERMINISTIC,
    MIN_SIZE,
    OTHER_SINGLES,
    WIDE,
    WIDE_MAGNITUDE,
    Extra,
    describe_sizes,
    equal_values,
    identical,
    magnitude,
    other_size,
    rewritten,
    size_constants,
    widening,
)
from htam_engine.vocabulary import PRECISION_FACTOR, ErrorKind

Outputs = list[torch.Tensor]
LATE_CHECK_S = 0.1  # how long after `done` a verified output is read again
WARMUP = 2  # untimed pairs first, at least; more while a side still faults in fresh
# memory (glibc's heap grows over a process's first calls of a large output: +4-60 ms a
# 16 MB call, seen for the reference's first 5 timed pairs), up to WARMUP_MAX pairs and
# WARMUP_MAX_S: a kernel that allocates afresh every call is timed so, on both sides
WARMUP_MAX = 12
WARMUP_MAX_S = 0.5
WARMUP_FAULTS = 64  # pages (256 KiB) a warm call may fault in (a small buffer's)
MIN_TRIALS = 10
JUDGED_SHARE = 0.3  # of the timed calls, besides the last
TIMING_BUDGET_S = 6.0  # past MIN_TRIALS, timing stops here even if not yet converged
# ... and goes on at least this long, so that an interval never rests on one short, lucky
# stretch of the machine's state (a second of 10 pairs at 30 ms saw one state)
MIN_TIMING_S = 1.0
CHECK_EVERY = 5  # trials between two looks at the interval (a bootstrap costs ~10 ms)
CALL_LIMIT_FACTOR = 500.0  # a timed call may take this many times the reference's (naive
# kernels run 100x slower than torch), ...
CALL_LIMIT_FLOOR_S = 2.0  # ... or this long, whichever is more
PRECISION_SHARE = 0.3  # of the judged timed calls, besides the last, checked in float64 too
PRECISION_SAMPLES = 3  # ... at most (the float64 reference is slow: a GEMM, 1 thread)
_rng = secrets.SystemRandom()


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


# Judged in chunks of this many elements: their temporaries are reused from the heap,
# while fresh ones of a whole output fault in page by page (4-6x the arithmetic's time).
_CHUNK = 1 << 16


def _chunks(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    return zip(*(t.reshape(-1).split(_CHUNK) for t in tensors), strict=True)


def _within(out: torch.Tensor, ref: torch.Tensor, tol: float, atol: float) -> torch.Tensor:
    if not out.is_floating_point():
        return out == ref
    return (out - ref).abs_() <= ref.abs().mul_(tol).add_(atol)  # NaN is never within


def close(out: torch.Tensor, ref: torch.Tensor, scale: float = 1.0) -> tuple[bool, str]:
    """Within KernelBench's per-dtype tolerance (atol = rtol, atol times `scale` for
    outputs `scale` times the task's own), and why not. The check runs in the outputs'
    own dtype (fast: timed outputs are judged too); the message is worked out only for
    a failure."""
    if out.shape != ref.shape:
        return False, f"shape {tuple(out.shape)} where {tuple(ref.shape)} was expected"
    tol = common.tolerance(ref.dtype)
    atol = tol * scale
    if all(bool(_within(a, b, tol, atol).all()) for a, b in _chunks(out, ref)):
        return True, ""
    ok = _within(out, ref, tol, atol)
    a, b = out.double(), ref.double()
    diff = (a - b).abs().nan_to_num(float("inf"))
    worst = int(diff.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape))
    return False, (
        f"{int((~ok).sum())}/{ok.numel()} values off by more than "
        f"{f'atol={atol:g}, rtol={tol:g}' if atol != tol else f'atol=rtol={tol:g}'}; "
        f"worst at {where}: got {a.flatten()[worst].item():.6g}, "
        f"expected {b.flatten()[worst].item():.6g}"
    )


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    """The relative L2 error of `out` against the float64 `exact`."""
    norms = [
        (float(torch.linalg.vector_norm(a.double() - b)), float(torch.linalg.vector_norm(b)))
        for a, b in _chunks(out, exact.double())
    ]
    scale = math.hypot(*(whole for _, whole in norms)) or 1.0
    return math.hypot(*(error for error, _ in norms)) / scale


class Checks:
    """Named checks; the first failure of each name (with its call) is kept."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.failures: dict[str, str] = {}
        self.notes: dict[str, str] = {}  # what a passed check says (a set skipped, and why)

    def fail(self, name: str, where: str, detail: str) -> None:
        self.failures.setdefault(name, f"{where}: {detail}")

    def note(self, name: str, detail: str) -> None:
        self.notes.setdefault(name, detail)

    def as_list(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "passed": False, "detail": self.failures[name]}
            if name in self.failures
            else {"name": name, "passed": True, "detail": self.notes.get(name, "")}
            for name in self.names
        ]


_VERIFY_CHECKS = (
    "output.inputs_unchanged",
    "output.shape",
    "output.dtype",
    "output.finite",
    "output.fresh",
    "output.synchronous",
    "output.values",
    "precision.float64",
    "verify.wide_values",
    "verify.deterministic",
    protocol.SHAPE_ONLY,
)
_TIMING_CHECKS = (
    "timing.outputs",
    "timing.call_count",
    "timing.inputs_unchanged",
    "timing.threads",
    "timing.precision",
)


_MARKS = ("staged", "done", "stored")
# the kinds a candidate's failure may have (its own error report, its death, its time):
# it cannot report a `reference_error` or `evaluator_error` to go unjudged
_WORKER_FAILURES = frozenset(
    {
        ErrorKind.COMPILE_ERROR,
        ErrorKind.RUNTIME_ERROR,
        ErrorKind.OOM,
        ErrorKind.CUDA_ERROR,
        ErrorKind.CRASH,
        ErrorKind.TIMEOUT,
        ErrorKind.CANCELLED,
        ErrorKind.CHEATING,
    }
)
# the kinds a reference worker's failure keeps (any other is a `reference_error`)
_KEPT_FROM_REFERENCE = frozenset({ErrorKind.TIMEOUT, ErrorKind.CHEATING})
VECTORIZER_CHARS = 2000
FLOOR_SHARE = 0.5  # of the harness's own work per call: no call is charged less (`samples`)
# The harness's share of a call, told under load (`samples`): the median read 1.67 ms
# for a GEMM's 0.66 when neighbours took 44 % of the time, placing it at "122 % of FP32
# peak" and stopping its run "at the limit".
HARNESS_QUANTILE = 0.1


@dataclass(frozen=True)
class Call:
    """One call: the wall time by this process's clock from letting the worker go to its
    `stored` mark arriving, the part of it neighbours held the CPU (`accounting`), and
    (believed for the reference only) the time between its `staged` and `done` marks by
    the worker's own clock."""

    wall_ms: float
    marked_ms: float
    mismatch: str
    stolen_ms: float = 0.0
    accounted: bool = False  # the kernel's books said what neighbours took
    faults: int = 0  # minor page faults of the worker's main process (0: unknown)

    @property
    def own_ms(self) -> float:
        return self.wall_ms - self.stolen_ms


def samples(
    calls: dict[str, list[Call]], trusted_marks: bool = True
) -> tuple[list[float], list[float], float]:
    """Milliseconds per timed call on each side: its whole call by this process's clock
    less what neighbours took (`own_ms`). The harness's work (staging, copying the
    outputs out, waking up) is the same on both sides and inside both times: nothing
    measured on one side is taken off the other, so a candidate that skips harness work
    gains nothing it is not seen to gain.

    The third value is the harness's share of a call, told from the reference's own
    marks (a low quantile over its calls of the rest, `HARNESS_QUANTILE`: that work is
    the same every call, and a neighbour's time the books missed only adds to it; 0 when
    its marks are not to be believed: it holds another candidate). No call can cost less
    than that work: one
    whose own time is below `FLOOR_SHARE` of it was charged a neighbour's time that was
    not, and is charged its whole wall time."""
    reference = calls["reference"]
    harness = 0.0
    if reference and trusted_marks:
        rests = sorted(c.own_ms * (1 - c.marked_ms / c.wall_ms) for c in reference)
        harness = rests[int(HARNESS_QUANTILE * (len(rests) - 1))]
    floor = FLOOR_SHARE * max(harness, 0.0)

    def charged(made: list[Call]) -> list[float]:
        return [c.own_ms if c.own_ms >= floor else c.wall_ms for c in made]

    return charged(reference), charged(calls["candidate"]), max(harness, 0.0)


def accounting_summary(calls: dict[str, list[Call]]) -> dict[str, float]:
    """What the neighbours took, for the verdict's conditions."""
    timed = [c for role in ROLES for c in calls[role]]
    if not timed:
        return {}
    return {
        "stolen_ms": sum(c.stolen_ms for c in timed),
        "stolen_share": sum(c.stolen_ms for c in timed) / max(sum(c.wall_ms for c in timed), 1e-9),
        "accounted_share": sum(c.accounted for c in timed) / len(timed),
        "faulting_share": sum(c.faults > WARMUP_FAULTS for c in timed) / len(timed),
    }


def _stamp(mark: dict[str, Any]) -> float:
    """The worker's own clock in a mark (perf_counter is system-wide on Linux)."""
    value = mark.get("t")
    return float(value) if isinstance(value, int | float) else float("nan")


class InputsAhead:
    """Timing's input sets, made in a thread while the judge waits for its job, its
    workers and the verification (never while a call is timed: `stop` comes first), so
    that a timed pair does not wait ~20 ms for its inputs. Each is used once, as one
    made on the spot is; it exists only in this process until its call."""

    def __init__(self, make: Callable[[], list[Any]], count: int) -> None:
        self.make = make
        self.made: list[list[Any]] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._fill, args=(count,), daemon=True)
        self.thread.start()
        atexit.register(self.stop)  # not inside torch while the interpreter ends

    def _fill(self, count: int) -> None:
        # the lowest priority: it takes only the time a core would idle (the workers'
        # start, the judge's waits), never theirs
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        with contextlib.suppress(Exception):  # the same inputs made on the spot say why
            while len(self.made) < count and not self.halt.is_set():
                self.made.append(self.make())

    def stop(self) -> None:
        self.halt.set()
        self.thread.join()

    def take(self) -> list[Any]:
        return self.made.pop() if self.made else self.make()


class Judge:
    def __init__(self, jobdir: Path, job: JobSpec, token: str, sides: dict[str, Side]) -> None:
        if job.init_seed is None:
            raise Stop(ErrorKind.EVALUATOR_ERROR, "the job has no init seed")
        self.jobdir = jobdir
        self.job = job
        self.init_seed = job.init_seed
        self.asked = Asked()  # what the candidate's evaluation asks: `take`
        self.token = token
        self.device = torch.device(job.device)
        self.reference = common.import_file("htam_reference", jobdir / "reference.py")
        self.sides = sides
        self.verify = Checks(_VERIFY_CHECKS)
        self.timing = Checks(_TIMING_CHECKS)
        self.accounting: dict[str, float] = {}
        self.observed: dict[str, int] = {}  # the most tasks and cores a call was seen using
        self.running: dict[str, list[tuple[str, tasks.Observed]]] = {role: [] for role in ROLES}
        self.precise = 0  # timed calls checked against float64
        self.compare = False

    # the caller's channel -------------------------------------------------------------
    def emit(self, message: protocol.Message) -> None:
        print(json.dumps({**protocol.encode(message), "token": self.token}), flush=True)

    def wait_caller(self, command: str) -> None:
        if sys.stdin.readline().strip() != command:
            raise SystemExit(0)

    # set-up ---------------------------------------------------------------------------
    def _model(self, init: list[Any], module: types.ModuleType | None = None) -> torch.nn.Module:
        torch.manual_seed(self.init_seed)
        model: torch.nn.Module = (module or self.reference).Model(*init)
        return model.to(self.device)

    def _make_inputs(self, alt: bool = False) -> list[Any]:
        torch.manual_seed(_rng.randrange(2**63))
        make = self.reference.get_inputs_alt if alt else self.reference.get_inputs
        return list(make())

    def _run_model(self, model: torch.nn.Module, inputs: list[Any], seed: int) -> Outputs:
        moved = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        torch.manual_seed(seed)  # the seed the workers get for these inputs: a forward
        # that draws random numbers (an LSTM's initial state) draws the same ones
        with torch.no_grad():
            return [o.detach().cpu() for o in _as_list(model(*moved))]

    def prepare(self) -> None:
        """Make the input sets and the expected outputs, and the workers' init arguments
        and buffers: all before the candidate is known (`standby`)."""
        torch.set_num_threads(self.job.threads)
        torch.manual_seed(self.init_seed)
        init = list(self.reference.get_init_inputs())
        model = self.model = self._model(init)
        count = self.job.input_sets
        has_alt = hasattr(self.reference, "get_inputs_alt")
        self.sets = [self._make_inputs(has_alt and i == count - 1) for i in range(count)]
        self.seeds = [_rng.randrange(2**63) for _ in self.sets]
        self.expected = [
            self._run_model(model, inputs, seed)
            for inputs, seed in zip(self.sets, self.seeds, strict=True)
        ]
        self.model64 = self._float64(model)
        self.exact = (
            [self._run_model(self.model64, [_double(x) for x in xs], seed)
             for xs, seed in zip(self.sets, self.seeds, strict=True)]
            if self.model64 is not None else None
        )  # fmt: skip
        self.out_items = [common.layout(out)[0] for out in self.expected]
        self.wide = self._wide_set(model)
        self.other = self._other_set(init)
        extras = [extra for extra in (self.wide, self.other) if extra is not None]
        sizes = (
            max(common.layout(inputs)[1] for inputs in self.sets + [e.inputs for e in extras]),
            max(common.layout(out)[1] for out in self.expected + [e.expected for e in extras]),
        )
        for side in self.sides.values():
            torch.save(init, side.box / "init.pt")
            side.make_buffers(sizes)
        count = sets_ahead(self.job.inputs_ahead_mb, sizes[0])
        # from here until `time_all` stops it, that thread draws from torch's global
        # generator: nothing in between relies on a seed (count_work's forward counts)
        self.ahead = InputsAhead(self._make_inputs, count)

    def _wide_set(self, model: torch.nn.Module) -> Extra | None:
        """An input set of the task's generator with each floating input scaled to reach
        |x| = WIDE_MAGNITUDE (`widening`; one that has no negatives gets random signs
        first, unless the reference is then not finite); None, with the check's note, where there is
        nothing to scale or the reference itself is not finite there."""
        base = self._make_inputs()
        floating = [
            i
            for i, x in enumerate(base)
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()
        ]
        ranges = {i: [float(v) for v in torch.aminmax(base[i])] for i in floating}
        peaks = {i: max(-low, high) for i, (low, high) in ranges.items()}
        scaled = [i for i in floating if 0 < peaks[i] < WIDE_MAGNITUDE]
        if not scaled:
            self.verify.note(
                WIDE, f"skipped: no floating input below |x| = {WIDE_MAGNITUDE:g} to widen"
            )
            return None
        unsigned = [i for i in scaled if ranges[i][0] >= 0]
        task = [magnitude(out) for out in self.expected[0]]
        reach = max(peaks[i] for i in scaled)
        for signs in (True, False) if unsigned else (False,):
            inputs = list(base)
            for i in scaled:
                wide = base[i]
                if signs and i in unsigned:
                    wide = torch.where(torch.rand(wide.shape) < 0.5, -wide, wide)
                inputs[i] = (wide * widening(wide)).to(base[i].dtype)
            seed = _rng.randrange(2**63)
            try:
                expected = self._run_model(model, inputs, seed)
            except Exception:  # e.g. a reference that checks its inputs' range
                continue
            magnitudes = [magnitude(out) for out in expected]
            if all(math.isfinite(m) for m in magnitudes):
                scales = [
                    max(1.0, wide / (own or 1.0))
                    for wide, own in zip(magnitudes, task, strict=False)
                ]
                where = (
                    f"inputs scaled to reach |x| = {WIDE_MAGNITUDE:g}"
                    f"{' with both signs' if signs else ''} (the task's reach {reach:.3g})"
                )
                return Extra(where, inputs, seed, expected, scales)
        self.verify.note(
            WIDE,
            f"skipped: the reference's own outputs are not finite (or it fails) for inputs "
            f"scaled to |x| up to {WIDE_MAGNITUDE:g}",
        )
        return None

    def _other_set(self, init: list[Any]) -> Extra | None:
        """An input set at other sizes (`other_size` of each module-level size constant
        whose change leaves the model as it is: the workers hold the task's), its
        expected outputs from the reference rewritten so; None, with the check's note,
        where the sizes are no such constants or the reference does not run so."""
        path = self.jobdir / "reference.py"
        source = path.read_text()
        task = size_constants(source)
        if not task:
            self.verify.note(
                protocol.SHAPE_ONLY,
                f"skipped: the task's sizes are no module-level integer constants "
                f"(such as `batch_size = 256`, at least {MIN_SIZE}) that could be changed",
            )
            return None
        usable = [name for name in task if self._same_model(source, path, {name: task[name]}, init)]
        tries = [usable] + ([[name] for name in usable[:OTHER_SINGLES]] if len(usable) > 1 else [])
        for names in tries:
            sizes = {name: other_size(task[name]) for name in names}
            extra = self._other_try(source, path, sizes, task, init)
            if extra is not None:
                return extra
        why = (
            "the reference fails, or is not finite, at other sizes"
            if usable
            else "changing any of them changes the model's parameters or init arguments"
        )
        constants = ", ".join(f"{name}={value}" for name, value in task.items())
        self.verify.note(protocol.SHAPE_ONLY, f"skipped: {why} (constants: {constants})")
        return None

    def _rewritten_model(
        self, source: str, path: Path, sizes: dict[str, int], init: list[Any]
    ) -> tuple[types.ModuleType, torch.nn.Module] | None:
        """The reference imported with `sizes`, and its model, where that model is the
        task's (the same init arguments and parameters): else None."""
        try:
            module = rewritten(source, path, sizes)
            torch.manual_seed(self.init_seed)
            if not equal_values(init, list(module.get_init_inputs())):
                return None
            model = self._model(init, module)
        except Exception:
            return None
        mine, theirs = self.model.state_dict(), model.state_dict()
        if mine.keys() != theirs.keys() or not all(
            identical(mine[key].cpu(), theirs[key].cpu()) for key in mine
        ):
            return None
        return module, model

    def _same_model(self, source: str, path: Path, sizes: dict[str, int], init: list[Any]) -> bool:
        changed = {name: other_size(value) for name, value in sizes.items()}
        return self._rewritten_model(source, path, changed, init) is not None

    def _other_try(
        self,
        source: str,
        path: Path,
        sizes: dict[str, int],
        task: dict[str, int],
        init: list[Any],
    ) -> Extra | None:
        made = self._rewritten_model(source, path, sizes, init)
        if made is None:
            return None
        module, model = made
        try:
            torch.manual_seed(_rng.randrange(2**63))
            inputs = list(module.get_inputs())
            seed = _rng.randrange(2**63)
            expected = self._run_model(model, inputs, seed)
        except Exception:
            return None
        shapes = [tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
        if shapes == [tuple(x.shape) for x in self.sets[0] if isinstance(x, torch.Tensor)]:
            return None  # the constants do not size the inputs
        if not all(math.isfinite(magnitude(out)) for out in expected):
            return None
        where = f"at sizes {describe_sizes(sizes, task)}"
        return Extra(where, inputs, seed, expected, [1.0] * len(expected))

    def _float64(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The reference in float64 (None when it cannot run so)."""
        try:
            exact = copy.deepcopy(model).double()
            self._run_model(exact, [_double(x) for x in self.sets[0]], self.seeds[0])
        except Exception:  # a reference that only works in its own dtype
            return None
        return exact

    def take(self, job: JobSpec) -> None:
        """The caller's job for the candidate now in the boxes: it must be the one this
        judge prepared for."""
        if replace(job, asked=None) != self.job:
            message = "the job does not match the judge started for it"
            raise Stop(ErrorKind.RUNTIME_ERROR, message)
        self.job = job
        self.asked = job.asked or Asked()
        # Comparing two candidates: the reference side holds the incumbent (untrusted,
        # already verified), and timed outputs are judged against the reference itself.
        self.compare = self.asked.compare
        for side in self.sides.values():
            side.child.send(json.dumps({"cmd": "job"}))  # each reads its box's job

    def load(self) -> None:
        for side in self.sides.values():
            side.child.send(json.dumps({"cmd": "load", "threads": self.job.threads}))
        if self.asked.count_work:  # while they load: a second on its first use
            roofline.write_work(self.jobdir / "work.json", self.model, self.sets[0], self.device)
        for side in self.sides.values():
            self._expect(side, "loaded", self.job.compile_s, "compile")
            freeze(side.child)  # from now on a worker runs only while it is called

    def vectorizer(self) -> str:
        """The candidate's builds' vectorizer reports (`kernels.VECTOR_REPORT`), capped."""
        build = self.sides["candidate"].box / "build"
        reports = sorted(build.glob(f"*{kernels.VECTOR_REPORT}")) if build.is_dir() else []
        text = "\n".join(p.read_text(errors="replace").strip() for p in reports)
        return text.strip()[:VECTORIZER_CHARS]

    # one call -------------------------------------------------------------------------
    def _expect(self, side: Side, wanted: str, limit_s: float, phase: str) -> dict[str, Any]:
        """The worker's next event, which must be `wanted`: an extra or forged line is a
        failed call count, a worker error ends the evaluation."""

        def unasked(event: dict[str, Any]) -> None:
            what = str(event.get("event"))[:40]
            self.timing.fail("timing.call_count", side.role, f"an unasked {what!r} report")

        try:
            event = side.child.wait_for(wanted, limit_s, phase, threading.Event(), unasked)
        except Stop as stop:
            if side.role == "candidate" and stop.kind not in _WORKER_FAILURES:
                said = stop.kind.value
                message = f"protocol.messages: the {side.role} reported a {said!r} failure"
                raise Stop(ErrorKind.CHEATING, message[:300]) from None
            if side.role == "reference" and self.compare:  # not the reference's fault
                raise Stop(
                    ErrorKind.RUNTIME_ERROR, f"the incumbent failed: {stop.message}", stop.log
                ) from None
            if side.role == "reference" and stop.kind not in _KEPT_FROM_REFERENCE:
                message = f"the reference failed: {stop.message}"
                raise Stop(ErrorKind.REFERENCE_ERROR, message, stop.log) from None
            raise
        return event

    def call(
        self,
        side: Side,
        inputs: list[Any],
        out_items: list[dict],
        limit_s: float,
        seed: int,
        phase: str = "time",
        policed: bool = False,
        probe: bool = False,
    ) -> Call:
        """Run one call on `side` (seeded with `seed` before its forward), timed by this
        process's clock; the side is left stopped, its outputs in its `out.bin`. A
        `policed` call (timed, past warm-up, on a CPU) is held to the thread and core
        policy."""
        items, _ = common.layout(inputs)
        for item, value in zip(items, inputs, strict=True):
            if isinstance(value, torch.Tensor):
                common.write_item(side.infile, item, value)
        canary = _rng.randint(1, 3)
        side.canaries += canary
        command = {
            "cmd": "call",
            "k": side.calls,
            "inputs": items,
            "in_size": side.in_size,
            "out": out_items,
            "out_size": side.out_size,
            "seed": seed,
            "canary": canary,
        }
        if probe:  # the worker reports the forward's exception as a mismatch and lives on
            command["probe"] = True
        side.tracked()
        members = list(side.child.frozen)
        cpu = self.device.type == "cpu"  # on a GPU the device's time counts, and the
        # driver's own threads are no policy's business
        tasks_before = tasks.snapshot(members) if cpu and policed else None
        before = side.books(members) if cpu else None
        thaw(side.child)
        if tasks_before:
            tasks_before = tasks.settled(tasks_before, members, side.main)
        start = time.perf_counter()  # the inputs are in place; the worker waits for the call
        side.child.send(json.dumps(command))
        marks = [self._expect(side, mark, limit_s, f"a {phase} call") for mark in _MARKS]
        # read before `freeze`: a stop waits for a CPU as well, after the call
        after = side.books(members) if before else None
        wall_s = time.perf_counter() - start
        seen = tasks.snapshot(side.child.members()) if tasks_before else None
        freeze(side.child)
        side.tracked()
        if tasks_before and seen:
            ran = tasks.observe(tasks_before, seen, side.core, wall_s, side.sandbox(members))
            self._policy(side, ran)
        if any(mark.get("k") != side.calls for mark in marks):
            self.timing.fail("timing.call_count", side.role, f"call {side.calls} mismatched")
        side.calls += 1
        mismatch = str(marks[-1].get("mismatch") or "")
        if mismatch and side.role == "reference":
            raise Stop(ErrorKind.REFERENCE_ERROR, f"the reference returned {mismatch}"[:600])
        staged, done = (_stamp(mark) for mark in marks[:2])
        wall_ms = (float(marks[-1]["_t"]) - start) * 1e3
        stolen = accounting.stolen_ms(before, after, wall_ms)
        marked_ms = (done - staged) * 1e3
        faults = accounting.faults(before, after)
        if stolen is None:
            return Call(wall_ms, marked_ms, mismatch, faults=faults)
        return Call(wall_ms, marked_ms, mismatch, stolen, accounted=True, faults=faults)

    def _policy(self, side: Side, ran: tasks.Observed) -> None:
        """The thread and core policy, seen from outside: no more tasks ran during the
        call than the policy's threads, on no core but the one it was pinned to."""
        if side.role == "reference" and not self.compare:
            return
        self.observed["cores"] = max(self.observed.get("cores", 0), len(ran.cores))
        where = f"{side.role} call {side.calls}"
        self.running[side.role].append((where, ran))
        if ran.parallel:
            self.timing.fail("timing.threads", where, "ran on more than one core at once")
        if ran.widened and side.core is not None:
            self.timing.fail("timing.threads", where, f"affinity widened to cores {ran.cores}")
            pin(side.child, side.core)  # pinned again: the reference is not slowed by it

    def _thread_policy(self) -> set[int]:
        """The thread policy over a timing's calls (`tasks.over_policy`): a side over it in
        most of its timed calls ran a task of its own beside them (`timing.threads`); the
        calls over it in fewer were disturbed (by the load, or by a helper now and then)
        and their pairs are left out of the timing. Returns those pairs' indices."""
        allowed, disturbed = self.job.threads, set()
        for seen in self.running.values():
            counts = [ran.running for _, ran in seen]
            self.observed["threads"] = max(
                self.observed.get("threads", 0), tasks.threads_seen(counts)
            )
            over, most = tasks.over_policy(counts, allowed)
            if most:
                where, ran = seen[over[0]]
                self.timing.fail(
                    "timing.threads",
                    where,
                    f"{ran.running} tasks ran (policy: {allowed}; over it in {len(over)} of "
                    f"{len(seen)} calls): {', '.join(ran.names)}",
                )
            disturbed.update(over)
        return disturbed

    def outputs(self, side: Side, out_items: list[dict]) -> Outputs:
        return _read(side, side.outfile, out_items)

    def inputs_after(self, side: Side, inputs: list[Any]) -> list[Any]:
        items, _ = common.layout(inputs)
        tensors = iter(_read(side, side.infile, [item for item in items if "offset" in item]))
        return [
            next(tensors) if "offset" in item else value
            for item, value in zip(items, inputs, strict=True)
        ]

    # verification ---------------------------------------------------------------------
    def verify_all(self) -> None:
        side = self.sides["candidate"]
        first: Outputs | None = None
        for index, inputs in enumerate(self.sets):
            limit = self.job.verify_s
            made = self.call(
                side, inputs, self.out_items[index], limit, self.seeds[index], "verify"
            )
            if made.mismatch:
                self.verify.fail("output.shape", f"input set {index + 1}", made.mismatch)
                continue
            got = self.outputs(side, self.out_items[index])
            first = got if index == 0 else first
            wrong = self._judge_set(index, got, self.inputs_after(side, inputs))
            if wrong:
                self._late(index, wrong, self._late_outputs(side, index, limit))
        if self.verify.failures or first is None:  # judged already: no time spent beyond
            for name in (WIDE, DETERMINISTIC, protocol.SHAPE_ONLY):
                self.verify.note(name, "not run: the task's own input sets failed")
            return
        self._verify_wide(side)
        self._verify_deterministic(side, first)
        self._verify_other(side)

    def _extra_call(self, side: Side, extra: Extra, probe: bool = False) -> Outputs | str:
        """Run `extra` on `side`: its outputs, or why they do not fit (a mismatch)."""
        limit = self.job.verify_s
        made = self.call(
            side, extra.inputs, extra.out_items, limit, extra.seed, "verify", probe=probe
        )
        if made.mismatch:
            return made.mismatch
        return self.outputs(side, extra.out_items)

    def _extra_wrong(self, side: Side, extra: Extra, got: Outputs) -> str:
        """Why `got` is not `extra`'s answer ('' when it is); a modified input is the
        same failure as at the task's inputs."""
        after = self.inputs_after(side, extra.inputs)
        for number, (before, now) in enumerate(zip(extra.inputs, after, strict=True)):
            if isinstance(before, torch.Tensor) and not _same(before, now):
                self.verify.fail(
                    "output.inputs_unchanged", extra.where, f"input {number} was modified"
                )
        for number, (out, ref, scale) in enumerate(
            zip(got, extra.expected, extra.scales, strict=True)
        ):
            ok, detail = close(out, ref, scale)
            if not ok:
                if out.is_floating_point() and not bool(torch.isfinite(out).all()):
                    detail = f"{int((~torch.isfinite(out)).sum())} NaN/Inf values"
                return f"output {number}: {detail}"
        return ""

    def _verify_wide(self, side: Side) -> None:
        """The task's shape with wide values (`_wide_set`): wrong there is `incorrect`."""
        extra = self.wide
        if extra is None:
            return
        got = self._extra_call(side, extra)
        wrong = got if isinstance(got, str) else self._extra_wrong(side, extra, got)
        if wrong:
            self.verify.fail(WIDE, extra.where, f"wrong for wide values: {wrong}")
        self.verify.note(WIDE, f"right for {extra.where}")

    def _verify_deterministic(self, side: Side, first: Outputs) -> None:
        """The first input set again (after other inputs: what a call leaves in freed
        memory has changed), its outputs bit for bit the first call's."""
        where = "input set 1, run twice"
        limit = self.job.verify_s
        made = self.call(side, self.sets[0], self.out_items[0], limit, self.seeds[0], "verify")
        if made.mismatch:
            self.verify.fail(DETERMINISTIC, where, f"the second call returned {made.mismatch}")
            return
        again = self.outputs(side, self.out_items[0])
        differ = [
            n for n, (a, b) in enumerate(zip(first, again, strict=True)) if not identical(a, b)
        ]
        if not differ:
            self.verify.note(DETERMINISTIC, "bit-identical outputs from two calls on input set 1")
            return
        if not self._reference_deterministic():
            self.verify.note(
                DETERMINISTIC, "skipped: the reference itself is not bit-identical run to run"
            )
            return
        a, b = first[differ[0]], again[differ[0]]
        count = int((a.reshape(-1).view(torch.uint8) != b.reshape(-1).view(torch.uint8)).sum())
        self.verify.fail(
            DETERMINISTIC,
            where,
            f"output {differ[0]} differs between two calls on the same inputs ({count} bytes "
            "of it): uninitialised memory read, or state kept between calls",
        )

    def _reference_deterministic(self) -> bool:
        """Whether the reference gives input set 1's expected outputs again, bit for bit
        (asked only when a candidate's do not: a non-deterministic op excuses it)."""
        again = self._run_model(self.model, self.sets[0], self.seeds[0])
        return all(identical(a, b) for a, b in zip(again, self.expected[0], strict=True))

    def _verify_other(self, side: Side) -> None:
        """Another shape (`_other_set`): wrong or refused there flags the verdict
        (`protocol.SHAPE_ONLY`), it does not fail it; a crash or a hang there ends the
        evaluation as anywhere, saying where."""
        extra = self.other
        if extra is None:
            return
        try:
            got = self._extra_call(side, extra, probe=True)
        except Stop as stop:
            message = f"{extra.where} (the task's own sizes passed): {stop.message}"
            raise Stop(stop.kind, message[:1200], stop.log, stop.line) from None
        wrong = got if isinstance(got, str) else self._extra_wrong(side, extra, got)
        if wrong:
            self.verify.fail(
                protocol.SHAPE_ONLY,
                "another shape",
                f"correct at the task's shape only: wrong {extra.where}: {wrong}",
            )
        self.verify.note(protocol.SHAPE_ONLY, f"right {extra.where}")

    def _late_outputs(self, side: Side, index: int, limit: float) -> Outputs:
        """Input set `index`'s outputs again, after the worker ran on LATE_CHECK_S: a
        result still being written after `done` (a side stream, a thread). Asked only
        of wrong outputs: a right one cannot become righter."""
        thaw(side.child)
        time.sleep(LATE_CHECK_S)
        side.child.send(json.dumps({"cmd": "late", "out": self.out_items[index],
                                    "out_size": side.out_size}))  # fmt: skip
        self._expect(side, "late", limit, "verify")
        freeze(side.child)
        return self.outputs(side, self.out_items[index])

    def _judge_set(self, index: int, got: Outputs, after: list[Any]) -> list[int]:
        """Judge input set `index`'s outputs `got` and inputs `after` the call; the
        numbers of the outputs that were wrong."""
        where = f"input set {index + 1}"
        for number, (before, now) in enumerate(zip(self.sets[index], after, strict=True)):
            if isinstance(before, torch.Tensor) and not _same(before, now):
                self.verify.fail("output.inputs_unchanged", where, f"input {number} was modified")
        wrong = []
        for number, (out, ref) in enumerate(zip(got, self.expected[index], strict=True)):
            ok, detail = close(out, ref)  # a NaN or Inf output is never close
            if not ok:
                wrong.append(number)
                if out.is_floating_point() and not bool(torch.isfinite(out).all()):
                    bad = int((~torch.isfinite(out)).sum())
                    self.verify.fail(
                        "output.finite", where, f"output {number}: {bad} NaN/Inf values"
                    )
                else:
                    self._wrong(index, out, detail)
            elif self.exact is not None:
                detail = _imprecise(out, ref, self.exact[index][number])
                if detail:
                    self.verify.fail("precision.float64", where, detail)
        return wrong

    def _wrong(self, index: int, out: torch.Tensor, detail: str) -> None:
        where = f"input set {index + 1}"
        stale = [
            j
            for j, other in enumerate(self.expected)
            if j != index and other[0].shape == out.shape and close(out, other[0])[0]
        ]
        if stale:
            self.verify.fail(
                "output.fresh", where, f"returned the answer for input set {stale[0] + 1}"
            )
        self.verify.fail("output.values", where, detail)

    def _late(self, index: int, wrong: list[int], late: Outputs) -> None:
        """Outputs `wrong` at `done` but right when read again: completed afterwards."""
        if any(close(late[number], self.expected[index][number])[0] for number in wrong):
            self.verify.fail(
                "output.synchronous",
                f"input set {index + 1}",
                "the result was completed after forward returned (side stream or thread)",
            )

    def report(self) -> list[dict[str, Any]]:
        """The worker's runtime checks, and `runtime.torch_ops` decided here from its raw
        op record, which must hold every canary op this side asked for."""
        side = self.sides["candidate"]
        thaw(side.child)
        side.child.send(json.dumps({"cmd": "report"}))
        event = self._expect(side, "report", 30, "report")
        freeze(side.child)
        worker = event.get("checks")
        ops = event.get("ops")
        if not isinstance(worker, list) or not isinstance(ops, dict):
            raise Stop(ErrorKind.CHEATING, "protocol.messages: a malformed report")
        if not all(_well_formed(check) for check in worker):
            raise Stop(ErrorKind.CHEATING, "protocol.messages: a malformed check in the report")
        checks = [check for check in worker if check["name"] != "runtime.torch_ops"]
        counts = {str(op): n for op, n in ops.items() if isinstance(n, int)}
        compute, missing = common.torch_compute(counts, side.canaries)
        return [
            common.check("runtime.torch_ops", not compute, "torch computes: " + ", ".join(compute)),
            common.check("runtime.recorder", not missing, missing),
            *checks,
        ]

    # timing ---------------------------------------------------------------------------
    def time_all(self) -> tuple[list[float], list[float], float]:
        """Reference and candidate calls on the same fresh inputs, alternating which goes
        first, after untimed warm-up pairs (`_warming`); a call may take
        `CALL_LIMIT_FACTOR` times the reference's median (so a hanging candidate holds the
        timing lock seconds, not the phase limit)."""
        warm: dict[str, list[Call]] = {role: [] for role in ROLES}
        calls: dict[str, list[Call]] = {role: [] for role in ROLES}
        self.ahead.stop()
        if self.device.type == "cpu":  # one core for both: a neighbour slows both alike
            core = quietest_core()
            for side in self.sides.values():
                side.core = core
                pin(side.child, core)
        started = time.monotonic()
        budget = started + min(TIMING_BUDGET_S, self.job.time_s * 0.8)
        items = self.out_items[0]
        for k in range(WARMUP_MAX + self.job.max_trials):
            warming = not calls["reference"] and self._warming(warm, started)
            final = not warming and self._enough(calls, started, budget)
            inputs, seed = self.ahead.take(), _rng.randrange(2**63)
            judged = final or (not warming and _rng.random() < JUDGED_SHARE)
            got: dict[str, Outputs] = {}
            for role in ROLES if k % 2 == 0 else ROLES[::-1]:
                limit = self._limit(warm["reference"] + calls["reference"])
                made = self.call(self.sides[role], inputs, items, limit, seed, policed=not warming)
                if made.mismatch:
                    self.timing.fail("timing.outputs", f"timed call {k + 1}", made.mismatch)
                    judged = False
                (warm if warming else calls)[role].append(made)
                if judged:
                    got[role] = self.outputs(self.sides[role], items)
            if judged:
                if self.compare:  # the incumbent's outputs are no standard
                    got["reference"] = self._run_model(self.model, inputs, seed)
                self._judge_timed(k, inputs, got)
                sampled = self.precise < PRECISION_SAMPLES and _rng.random() < PRECISION_SHARE
                if final or sampled:
                    self.precise += 1
                    self._judge_precision(k, inputs, seed, got)
            if final:
                break
        disturbed = self._thread_policy()
        self.accounting = {
            **accounting_summary(calls),
            **{f"{name}_seen": float(count) for name, count in self.observed.items()},
            "warmup_pairs": float(len(warm["reference"])),
            "disturbed_share": len(disturbed) / max(len(calls["candidate"]), 1),
        }
        kept = {
            role: [c for index, c in enumerate(made) if index not in disturbed]
            for role, made in calls.items()
        }
        if len(kept["candidate"]) < MIN_TRIALS:  # too few left: all of them, noisy
            kept = calls
        return samples(kept, trusted_marks=not self.compare)

    @staticmethod
    def _warming(warm: dict[str, list[Call]], started: float) -> bool:
        """Whether the next pair is warm-up too: fewer than WARMUP so far, or a side
        faulted in fresh memory in either of the last two pairs (a heap grows in fits:
        one clean call among faulting ones is common), while WARMUP_MAX pairs and
        WARMUP_MAX_S last."""
        done = len(warm["reference"])
        if done < WARMUP:
            return True
        if done >= WARMUP_MAX or time.monotonic() - started > WARMUP_MAX_S:
            return False
        return any(c.faults > WARMUP_FAULTS for made in warm.values() for c in made[-2:])

    def _limit(self, reference: list[Call]) -> float:
        """A call's time limit from the reference's calls so far."""
        if not reference:
            return float(self.job.time_s)
        median_s = statistics.median(c.wall_ms for c in reference) / 1e3
        return max(CALL_LIMIT_FLOOR_S, CALL_LIMIT_FACTOR * median_s)

    def _enough(self, calls: dict[str, list[Call]], started: float, budget: float) -> bool:
        """Whether the next pair is the last: past the minimum of trials and of time (its
        warm-up included), the paired speedup's 95 % interval is narrow enough
        (`JobSpec.target_half_width`) or the time budget is spent; or the trial cap is
        reached."""
        done = min(len(c) for c in calls.values())
        if done + 1 >= self.job.max_trials:
            return True
        if done < MIN_TRIALS or time.monotonic() - started < MIN_TIMING_S:
            return False
        if time.monotonic() > budget:
            return True
        if done % CHECK_EVERY:
            return False
        reference, candidate, _ = samples(calls, trusted_marks=not self.compare)
        job = self.job  # narrow, or decided
        return stats.job_settled(
            reference, candidate, job.target_half_width, self.asked.decide, job.run_to_run_cv
        )

    def _judge_timed(self, k: int, inputs: list[Any], got: dict[str, Outputs]) -> None:
        where = f"timed call {k + 1}"
        after = self.inputs_after(self.sides["candidate"], inputs)
        if any(
            isinstance(a, torch.Tensor) and not _same(a, b)
            for a, b in zip(inputs, after, strict=True)
        ):
            self.timing.fail("timing.inputs_unchanged", where, "an input was modified")
        for out, ref in zip(got["candidate"], got["reference"], strict=True):
            ok, detail = close(out, ref)
            if not ok:
                self.timing.fail(
                    "timing.outputs", where, f"a timed output is wrong ({detail})"[:400]
                )

    def _judge_precision(
        self, k: int, inputs: list[Any], seed: int, got: dict[str, Outputs]
    ) -> None:
        """A timed call's outputs as exact against a float64 reference as the verified
        ones had to be: a candidate cannot be exact while verified and cheaper after."""
        if self.model64 is None:
            return
        exact = self._run_model(self.model64, [_double(x) for x in inputs], seed)
        for out, ref, best in zip(got["candidate"], got["reference"], exact, strict=True):
            detail = _imprecise(out, ref, best)
            if detail:
                self.timing.fail("timing.precision", f"timed call {k + 1}", detail)

    # the whole evaluation -------------------------------------------------------------
    def run(self) -> None:
        self.load()
        self.emit(protocol.Compiled(sandbox.sandbox_mode(), self.vectorizer()))
        self.wait_caller(protocol.VERIFY)
        self.verify_all()
        runtime = self.report()
        count = [c for c in self.timing.as_list() if c["name"] == "timing.call_count"]
        checks = self.verify.as_list() + runtime + count
        self.emit(protocol.Verified(_checks(checks), len(self.sets)))
        self.wait_caller(protocol.TIME)
        with timing_lock(self.device.type):
            self.emit(protocol.Timing())
            reference, candidate, share = self.time_all()
        for side in self.sides.values():
            self._leftovers(side)
        checks = self.timing.as_list() + self.report()
        self.emit(
            protocol.Timed(
                ref=reference,
                cand=candidate,
                harness_ms=share,
                checks=_checks(checks),
                threads=max(self.job.threads, self.observed.get("threads", 0)),
                accounting=self.accounting,
            )
        )

    def _leftovers(self, side: Side) -> None:
        """A line the worker wrote that no call asked for is a forged report."""
        extra = side.child.pending()
        if extra:
            self.timing.fail("timing.call_count", side.role, f"{len(extra)} unasked reports")


def _imprecise(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> str:
    """Why `out` is less exact against the float64 `exact` than its dtype's work ever
    needs to be (and than the reference `ref` in that dtype, by `PRECISION_FACTOR`): an
    answer within tolerance but computed at lower precision (fp32 work in half, fp64
    work in fp32); '' when it is not."""
    floor = common.precision_floor(ref.dtype)
    if floor is None or not out.is_floating_point():
        return ""
    error, ref_error = relative_error(out, exact), relative_error(ref, exact)
    if error <= max(floor, PRECISION_FACTOR * ref_error):
        return ""
    return (
        f"relative error {error:.2e} against a float64 reference, the {ref.dtype} "
        f"reference's is {ref_error:.2e} (lower-precision arithmetic?)"
    )


def sizes_on_meta(path: Path) -> protocol.Sized:
    """The bytes of one input set of the reference at `path` and of its outputs, run on
    meta tensors (nothing allocated): what the caller needs to refuse a problem too large
    before any input set exists, and each input's shape and dtype, however `get_inputs`
    builds them. The reference's failure here only leaves a size unknown (its evaluation
    reports it)."""
    try:
        with torch.device("meta"):
            module = common.import_file("htam_reference_sizes", path)
            inputs = list(module.get_inputs())
    except Exception as error:
        why = f"no estimate: the reference does not run on meta tensors ({type(error).__name__})"
        return protocol.Sized(None, None, why)
    try:
        with torch.device("meta"), torch.no_grad():
            outputs = _as_list(module.Model(*module.get_init_inputs())(*inputs))
    except Exception as error:  # a forward meta tensors cannot run
        why = f"outputs unknown ({type(error).__name__})"
        return protocol.Sized(_bytes(inputs), None, why, _shapes(inputs))
    return protocol.Sized(_bytes(inputs), _bytes(outputs), shapes=_shapes(inputs))


def _shapes(values: list[Any]) -> list[str]:
    """Each value as a prompt shows it: a tensor's dtype and shape, anything else its repr."""
    return [
        f"{str(v.dtype).removeprefix('torch.')}[{', '.join(map(str, v.shape))}]"
        if isinstance(v, torch.Tensor)
        else repr(v)[:60]
        for v in values
    ]


def _bytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _well_formed(check: Any) -> bool:
    return (
        isinstance(check, dict)
        and isinstance(check.get("name"), str)
        and isinstance(check.get("passed"), bool)
        and isinstance(check.get("detail", ""), str)
    )


def _checks(raw: list[dict[str, Any]]) -> list[Check]:
    return [Check.from_json(check) for check in raw]


def _read(side: Side, descriptor: int, items: list[dict[str, Any]]) -> Outputs:
    """The tensors `items` from one of `side`'s buffer files, copied: a file the worker
    truncated is its doing (`output.buffer`), never this process's fault."""
    found = []
    for item in items:
        value = common.read_item(descriptor, item)
        if value is None:
            raise Stop(ErrorKind.CHEATING, f"output.buffer: the {side.role} truncated its buffers")
        found.append(value)
    return found
