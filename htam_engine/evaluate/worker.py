"""The candidate worker: `python -m htam_engine.evaluate.worker JOBDIR`.

It is the only process that imports the candidate. It compiles (imports) it, waits for
`verify` on stdin, runs it on the judge's inputs and saves what it returned, then waits
for `time` and times reference and candidate on the same inputs. It decides nothing:
the judge compares, the caller decides. Timers and the functions whose replacement
would forge a number are captured before the candidate is imported.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from htam_engine.evaluate import common
from htam_engine.evaluate.static import LAYOUT_OPS

_PERF = time.perf_counter
_SLEEP = time.sleep
_SAVE = torch.save
_LOAD = torch.load
_CUDA_EVENT = torch.cuda.Event
_CUDA_SYNC = torch.cuda.synchronize
_GUARDED = common.guarded_attributes()
_FRAME_EVENTS: list[str] = []
LATE_CHECK_S = 0.1  # how long after forward returns the output is saved again
_WATCH_FRAMES = threading.Event()

# aten ops that only allocate, view or copy: anything else in forward is torch compute.
_LAYOUT_OPS = LAYOUT_OPS | {
    "new_empty_strided",
    "_unsafe_view",
    "_reshape_alias",
    "_to_copy",
    "select",
    "slice",
    "as_strided",
    "alias",
    "lift_fresh",
    "resize_",
    "set_",
    "split",
    "unbind",
}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Note frame lookups during forward that hand out this harness's frames or the
    candidate's own (a way to walk up into the harness); torch's internal lookups of its
    own frames are not noted."""
    if not _WATCH_FRAMES.is_set():
        return
    if event == "sys._current_frames":
        _FRAME_EVENTS.append(event)
    elif event == "sys._getframe" and args:
        filename = getattr(getattr(args[0], "f_code", None), "co_filename", "")
        if filename == __file__ or "/candidate/" in filename:
            _FRAME_EVENTS.append(f"{event} -> {Path(filename).name}")


class _OpRecorder(TorchDispatchMode):
    """Records the aten ops a forward dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


class Worker:
    def __init__(self, jobdir: Path, events: Any) -> None:
        self.jobdir = jobdir
        self.events = events
        self.job = json.loads((jobdir / "job.json").read_text())
        self.device = torch.device(self.job["device"])
        self.candidate_path = jobdir / self.job["candidate_file"]
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.model: Any = None
        self.reference: Any = None

    def emit(self, **event: Any) -> None:
        self.events.write(json.dumps(event) + "\n")
        self.events.flush()

    def wait_for(self, command: str) -> None:
        line = sys.stdin.readline().strip()
        if line != command:
            raise SystemExit(0)  # the caller is done with us

    def compile(self) -> None:
        common.share_inline_builds()
        self.reference = common.import_file("htam_reference", self.jobdir / "reference.py")
        torch.manual_seed(self.job["init_seed"])
        init = self.reference.get_init_inputs()
        if self.job["kind"] == "cu":
            self.model = common.cuda_entry_model(
                self.candidate_path.read_text(), self.job["entry"], self.job["name"]
            )
        else:
            module = common.import_file("htam_candidate", self.candidate_path)
            if not hasattr(module, "ModelNew"):
                raise common.CandidateError("the candidate defines no `ModelNew`")
            torch.manual_seed(self.job["init_seed"])
            self.model = module.ModelNew(*init)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(self.device)

    def _inputs(self, index: int) -> list[Any]:
        data = _LOAD(self.jobdir / f"inputs_{index}.pt", weights_only=True)
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in data]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    def verify(self) -> None:
        # Fresh allocations (torch.empty and friends) come back NaN-filled, so an output
        # the candidate never wrote cannot pass for a result.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
        ops: set[str] = set()
        types: set[str] = set()
        for index in range(self.job["input_sets"]):
            inputs = self._inputs(index)
            recorder = _OpRecorder()
            _WATCH_FRAMES.set()
            with torch.no_grad(), recorder:
                out = self.model(*inputs)
            _WATCH_FRAMES.clear()
            self._sync()
            outputs = list(out) if isinstance(out, tuple | list) else [out]
            types.update(type(o).__name__ for o in outputs if type(o) is not torch.Tensor)
            plain = [
                o.as_subclass(torch.Tensor) if isinstance(o, torch.Tensor) else o for o in outputs
            ]
            _SAVE({"inputs": inputs, "outputs": plain}, self.jobdir / f"cand_{index}.pt")
            _SLEEP(LATE_CHECK_S)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            _SAVE({"outputs": plain}, self.jobdir / f"late_{index}.pt")
            ops |= recorder.ops
        self.emit(event="verified", checks=self._runtime_checks(ops, types))

    def _runtime_checks(self, ops: set[str], types: set[str]) -> list[dict[str, Any]]:
        compute = sorted(op for op in ops if op not in _LAYOUT_OPS and op + "_" not in _LAYOUT_OPS)
        patched = common.changed_attributes(_GUARDED)
        threads = [
            t.name
            for t in threading.enumerate()
            if t.ident not in self.threads_before and t.is_alive()
        ]
        nan_fill = torch.are_deterministic_algorithms_enabled() and bool(
            torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
        )
        return [
            common.check("runtime.nan_fill", nan_fill, "NaN-filling of fresh memory was disabled"),
            common.check("runtime.torch_ops", not compute, "torch computes: " + ", ".join(compute)),
            common.check("runtime.monkeypatch", not patched, "replaced: " + ", ".join(patched)),
            common.check(
                "runtime.frame_inspection",
                not _FRAME_EVENTS,
                f"{len(_FRAME_EVENTS)} frame lookups during forward: {_FRAME_EVENTS[0]}"
                if _FRAME_EVENTS
                else "",
            ),
            common.check(
                "runtime.threads", not threads, "threads left running: " + ", ".join(threads)
            ),
            common.check("runtime.output_type", not types, "returned " + ", ".join(sorted(types))),
        ]

    def time(self) -> None:
        torch.use_deterministic_algorithms(False)  # NaN-filling would be timed too
        inputs = self._inputs(0)
        torch.manual_seed(self.job["init_seed"])
        ref = self.reference.Model(*self.reference.get_init_inputs()).to(self.device)
        limit = self.job["max_trials"]
        with torch.no_grad():
            ref_samples = self._samples(lambda: ref(*inputs), limit)
            cand_samples = self._samples(lambda: self.model(*inputs), limit)
        self.emit(event="timed", ref=ref_samples, cand=cand_samples)

    def _samples(self, call: Callable[[], Any], limit: int) -> list[float]:
        """Milliseconds per call: warm-up, then trials until the standard error of the
        mean is under 1 % of the median (at least 10, at most `limit`)."""
        for _ in range(3):
            call()
        self._sync()
        flush = common.l2_flush_buffer(self.device)
        samples: list[float] = []
        while len(samples) < limit:
            samples.append(self._trial(call, flush))
            if len(samples) >= 10:
                stderr = statistics.stdev(samples) / len(samples) ** 0.5
                if stderr < 0.01 * statistics.median(samples):
                    break
        return samples

    def _trial(self, call: Callable[[], Any], flush: torch.Tensor | None) -> float:
        if flush is None:
            start = _PERF()
            call()
            return (_PERF() - start) * 1e3
        flush.zero_()
        begin, end = _CUDA_EVENT(enable_timing=True), _CUDA_EVENT(enable_timing=True)
        _CUDA_SYNC()
        begin.record()
        call()
        end.record()
        _CUDA_SYNC()
        return float(begin.elapsed_time(end))


def _error_event(error: BaseException, candidate: Path) -> dict[str, Any]:
    kind, log = common.classify(error)
    frames = traceback.extract_tb(error.__traceback__)
    lines = [f.lineno for f in frames if f.filename == str(candidate) and f.lineno]
    if isinstance(error, SyntaxError) and error.filename == str(candidate):
        lines.append(error.lineno or 0)
    tail = "".join(traceback.format_exception_only(type(error), error)).strip()
    if isinstance(error, common.CandidateError):
        tail = str(error)
    return {
        "event": "error",
        "kind": kind,
        "message": tail[-2000:],
        "log": log,
        "line": lines[-1] if lines else None,
    }


def main(jobdir: Path) -> None:
    events = os.fdopen(os.dup(1), "w")
    log = os.open(jobdir / "candidate.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.addaudithook(_audit)
    worker = Worker(jobdir, events)
    phase = "compile"
    try:
        worker.compile()
        worker.emit(event="compiled")
        worker.wait_for("verify")
        phase = "verify"
        worker.verify()
        worker.wait_for("time")
        phase = "time"
        worker.time()
    except SystemExit:
        raise
    except BaseException as error:  # every failure of the candidate becomes a verdict
        event = _error_event(error, worker.candidate_path)
        event["phase"] = phase
        worker.emit(**event)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidates' atexit hooks cannot run


if __name__ == "__main__":
    main(Path(sys.argv[1]))
