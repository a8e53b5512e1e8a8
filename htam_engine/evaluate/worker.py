"""The harness in a sandboxed worker: `python -m htam_engine.evaluate.worker BOX ROLE`.

ROLE is `candidate` (imports the candidate and nothing of the reference) or `reference`
(imports only the reference): both sides run this same code, so they are called the same
way. The judge drives it one call at a time over stdin: it writes that call's inputs into
`in.bin` in the box just before the call, and the harness copies the outputs into
`out.bin` before it answers `done`. Every call, verified or timed, goes through the same
path with the same settings and instruments; the harness decides nothing, and the judge
believes none of its words, only its own clock and what it reads from `out.bin`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import profile

from htam_engine import kernels
from htam_engine.evaluate import common
from htam_engine.evaluate.jobspec import WorkerJob

_GUARDED = common.guarded_attributes()
_WATCH = threading.Event()  # set while the model runs
_FRAME_EVENTS: list[str] = []
_LIBRARY_CALLS: list[str] = []
_LIBRARY_DIRS = ("/numpy/", "/scipy/", "/numba/", "/jax/", "/cupy/")
_CONVERSIONS = frozenset({"numpy", "from_numpy", "__array__", "asarray", "array"})


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Frame lookups during a call that hand out this harness's frames or the candidate's
    own (a way to walk up into the harness); torch's lookups of its own are not noted."""
    if not _WATCH.is_set():
        return
    if event == "sys._current_frames":
        _FRAME_EVENTS.append(event)
    elif event == "sys._getframe" and args:
        filename = getattr(getattr(args[0], "f_code", None), "co_filename", "")
        if filename == __file__ or "/candidate/" in filename:
            _FRAME_EVENTS.append(f"{event} -> {Path(filename).name}")


def _library_probe(frame: Any, event: str, arg: Any) -> None:
    """Note numpy/scipy (or tensor <-> ndarray conversion) used while the model runs:
    another library doing the work is invisible to the aten op recorder."""
    if event == "call" and any(d in frame.f_code.co_filename for d in _LIBRARY_DIRS):
        _LIBRARY_CALLS.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
    elif event == "c_call":
        module = getattr(arg, "__module__", None) or ""
        name = getattr(arg, "__name__", "")
        if module.split(".")[0] in ("numpy", "scipy") or name in _CONVERSIONS:
            _LIBRARY_CALLS.append(f"{module or 'torch'}.{name}")


@contextlib.contextmanager
def _unwatched() -> Iterator[None]:
    """The library probe paused: Triton's interpreter computes with numpy by design
    (what its kernels may call is checked statically)."""
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(previous)


def _prepare_triton(device: str) -> None:
    """Triton's interpreter set up where the job needs it (imported here: the backend's
    module brings a parser no other job's worker should pay for at its start)."""
    from htam_engine import triton_backend

    if triton_backend.interpreted(device):
        triton_backend.prepare_interpreter(unwatched=_unwatched)


def _op_name(event: Any) -> str:
    return str(event.name).split("::")[-1]


# What an allowed library op runs inside itself besides layout ops (a convolution's or
# a transposed convolution's bias add, GEMM's alpha/beta scaling). Anything else below
# an allowed op counts as torch compute: an `aten::mm` a candidate re-implemented with
# other torch ops is no library GEMM.
_INSIDE_ALLOWED = frozenset(
    {"add", "add_", "mul", "mul_", "copy_", "fill_", "zero_", "as_strided_", "_nnpack_available"}
)


def _ops(prof: profile, allowed: frozenset[str]) -> tuple[Counter[str], set[str]]:
    """(ops that ran outside every allowed op, the allowed ops that ran). An op run
    inside an allowed one is part of it when it is one of `_INSIDE_ALLOWED` (or layout,
    or allowed itself); of nested allowed ops (`linear` calling `addmm`) the outermost
    is named."""
    free: Counter[str] = Counter()
    used: set[str] = set()
    for event in prof.function_events:
        outer, node = None, event.cpu_parent
        while node is not None:
            if _op_name(node) in allowed:
                outer = _op_name(node)
            node = node.cpu_parent
        name = _op_name(event)
        if name in allowed:
            used.add(outer or name)
        elif outer is not None and (name in _INSIDE_ALLOWED or name.rstrip("_") in allowed):
            used.add(outer)  # e.g. `mv` running `addmv_`
        else:
            free[name] += 1
    return free, used


class Harness:
    def __init__(self, box: Path, role: str, events: Any) -> None:
        self.box = box
        self.role = role
        self.events = events
        self.job = WorkerJob.from_json(json.loads((box / "job.json").read_text()))
        self.device = torch.device(self.job.device)
        self.candidate_path = box / (self.job.candidate_file or "reference.py")
        self.threads_before: set[int | None] = set()
        self.model: Any = None
        self.ops: Counter[str] = Counter()  # aten ops outside the allowed ones, counted
        self.canary = torch.ones(1)
        # the aten ops the trusted side's policy lets torch compute (`--allow-torch`)
        self.allowed = frozenset(self.job.allow_torch)
        self.used: set[str] = set()
        self.profiler = profile(use_cpu=True)  # replaced by a running one at load
        self.types: set[str] = set()
        self.aliased = False
        self.into_buffer = False  # an output was the harness's own output buffer
        self.last: list[torch.Tensor] = []
        self.maps: dict[str, torch.Tensor] = {}
        self.flush = common.l2_flush_buffer(self.device)

    def emit(self, **event: Any) -> None:
        self.events.write(json.dumps(event) + "\n")
        self.events.flush()

    def load(self, threads: int) -> None:
        torch.set_num_threads(threads)
        init = torch.load(self.box / "init.pt", weights_only=True)
        kernels.use_build_dir(self.box / "build")
        common.share_inline_builds(self.box / "torch_extensions")
        if self.role == "reference" and self.job.candidate_file is None:  # else a comparison
            module = common.import_file("htam_reference", self.box / "reference.py")
            torch.manual_seed(self.job.init_seed)
            self.model = module.Model(*init)
            if self.job.baseline == "compiled":  # `--baseline compile`
                self.model = _compiled(self.model.to(self.device), module, self.box, self.device)
        elif self.job.kind == "cu":
            assert self.job.entry is not None  # a `.cu` task always names it (`task`)
            self.model = common.cuda_entry_model(
                self.candidate_path.read_text(), self.job.entry, self.job.name
            )
        else:
            if self.job.backend == "triton":
                _prepare_triton(self.job.device)
            module = common.import_file("htam_candidate", self.candidate_path)
            if not hasattr(module, "ModelNew"):
                raise common.CandidateError("the candidate defines no `ModelNew`")
            torch.manual_seed(self.job.init_seed)
            self.model = module.ModelNew(*init)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(self.device)
        self.threads_before = {t.ident for t in threading.enumerate()}
        self._record()

    def _record(self) -> None:
        """Record every aten op from now on (at the dispatcher, below any Python mode a
        candidate could switch off), in all calls alike."""
        self.profiler = profile(use_cpu=True)
        self.profiler.__enter__()

    def _map(self, name: str, size: int) -> torch.Tensor:
        """`box/name` as shared bytes (re-mapped only when its size changes)."""
        if name not in self.maps or self.maps[name].numel() != size:
            self.maps[name] = torch.from_file(
                str(self.box / name), shared=True, size=size, dtype=torch.uint8
            )
        return self.maps[name]

    def _inputs(self, layout: list[dict[str, Any]], size: int) -> list[Any]:
        data = self._map("in.bin", max(size, 1))
        inputs = []
        for item in layout:
            if "value" in item:
                inputs.append(item["value"])
                continue
            tensor = common.tensor_view(data, item)
            inputs.append(tensor if self.device.type == "cpu" else tensor.to(self.device))
        return inputs

    def call(self, command: dict[str, Any]) -> None:
        """Run the model once on the inputs in `in.bin`, marking `staged` (inputs ready),
        `done` (the model returned, with this process's clock: the judge may not get a
        core while the model runs) and `stored` (outputs copied out). The judge's clock
        runs from before this process was let go to `stored`, on both sides alike; only
        the reference's marks are believed, to tell the harness's share of a call."""
        # the last call's outputs are kept for its `late` check only, asked before this
        # call: held through this call's forward, they split the heap (an aligned block
        # does not fit the hole its twin left), so a third of an L2 norm reference's
        # calls faulted in 8 MiB of fresh pages (+3 ms of 1 ms) and the heap grew 200 MiB
        self.last = []
        inputs = self._inputs(command["inputs"], command["in_size"])
        if self.flush is not None:
            self.flush.zero_()
        self._seed(command.get("seed"))
        for _ in range(int(command.get("canary", 0))):  # the judge counts them in the record
            torch.ops.aten.frac(self.canary)
        self._sync()
        self.emit(event="staged", k=command["k"], t=time.perf_counter())
        raised = ""
        with torch.no_grad():
            _WATCH.set()
            sys.setprofile(_library_probe)
            try:
                result = self.model(*inputs)
            except Exception as error:
                # a probe (the judge's other shape, verification only): a candidate
                # that refuses it says so and stays loaded; else its error ends it
                if not command.get("probe"):
                    raise
                result, raised = None, f"raised {type(error).__name__}: {error}"[:300]
            finally:
                sys.setprofile(None)
                _WATCH.clear()
            self._sync()
            self.emit(event="done", k=command["k"], t=time.perf_counter())
            out = self._map("out.bin", max(command["out_size"], 1))
            mismatch = raised or self._store(result, command["out"], out, inputs)
        self.emit(event="stored", k=command["k"], mismatch=mismatch)

    def _seed(self, seed: Any) -> None:
        """The judge's seed for this call, set just before forward (outside the marks):
        a forward that draws random numbers (an LSTM's initial state, dropout in training
        mode) draws on both sides the ones the expected outputs were computed with."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            return
        # the generator itself: `torch.manual_seed` also looks for every other device
        # kind, ~0.1-0.4 ms of every timed call on both sides for nothing
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed_all(seed)

    def _store(
        self, result: Any, layout: list[dict[str, Any]], out: torch.Tensor, inputs: list[Any]
    ) -> str:
        """Copy the outputs into `out.bin`; '' or why they do not fit the expected layout."""
        outputs = list(result) if isinstance(result, tuple | list) else [result]
        if len(outputs) != len(layout):
            return f"{len(outputs)} outputs, expected {len(layout)}"
        for number, (value, item) in enumerate(zip(outputs, layout, strict=True)):
            if not isinstance(value, torch.Tensor):
                return f"output {number} is {type(value).__name__}"
            if type(value) is not torch.Tensor:
                self.types.add(type(value).__name__)
            plain = value.as_subclass(torch.Tensor)
            if list(plain.shape) != item["shape"] or str(plain.dtype) != item["dtype"]:
                return (
                    f"output {number}: shape {list(plain.shape)} {plain.dtype}, "
                    f"expected {item['shape']} {item['dtype']}"
                )
            pointer = plain.untyped_storage().data_ptr()
            self.aliased |= any(
                isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == pointer
                for x in inputs
            )
            self.into_buffer |= _overlaps(plain, out)
            common.tensor_view(out, item).copy_(plain)
            self.last.append(plain)
        self._sync()
        return ""

    def late(self, command: dict[str, Any]) -> None:
        """Copy the last outputs again (the judge compares: was the answer completed
        after `done`?)."""
        out = self._map("out.bin", max(command["out_size"], 1))
        for value, item in zip(self.last, command["out"], strict=False):
            common.tensor_view(out, item).copy_(value)
        self._sync()
        self.emit(event="late")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def report(self) -> None:
        try:
            self.profiler.__exit__(None, None, None)
            free, used = _ops(self.profiler, self.allowed)
        except Exception:  # switched off from inside: the judge misses its canaries
            free, used = Counter(), set()
        self.ops += free
        self.used |= used
        self._record()
        # the raw counts: the judge decides what is compute, and checks its canaries
        self.emit(event="report", checks=self._runtime_checks(), ops=dict(self.ops))

    def _runtime_checks(self) -> list[dict[str, Any]]:
        patched = common.changed_attributes(_GUARDED)
        threads = [
            t.name
            for t in threading.enumerate()
            if t.ident not in self.threads_before and t.is_alive()
        ]
        libraries = sorted(set(_LIBRARY_CALLS))
        frames = _FRAME_EVENTS[:1]
        return [
            # what the policy let torch compute: the caller checks it against its policy
            {
                "name": "runtime.allowed_torch_ops",
                "passed": True,
                "detail": ",".join(sorted(self.used)),
            },
            common.check(
                "runtime.library", not libraries, "another library works: " + ", ".join(libraries)
            ),
            common.check("runtime.monkeypatch", not patched, "replaced: " + ", ".join(patched)),
            common.check(
                "runtime.frame_inspection",
                not frames,
                f"{len(_FRAME_EVENTS)} frame lookups during forward: {frames[0] if frames else ''}",
            ),
            common.check(
                "runtime.threads", not threads, "threads left running: " + ", ".join(threads)
            ),
            common.check(
                "runtime.output_type", not self.types, "returned " + ", ".join(sorted(self.types))
            ),
            common.check(
                "runtime.aliasing", not self.aliased, "an output shares memory with an input"
            ),
            common.check(
                "runtime.output_buffer",
                not self.into_buffer,
                "an output is the harness's own output buffer (its copy out skipped)",
            ),
        ]


def _overlaps(value: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether `value`'s storage shares bytes with `buffer`: the buffer is reachable from
    Python while the model runs (through `gc`, whatever the harness holds), so an output
    written straight into it is refused rather than its skipped copy counted as speed."""
    storage = value.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    low = buffer.untyped_storage().data_ptr()
    return start < low + buffer.untyped_storage().nbytes() and low < end


def _compiled(model: Any, module: Any, box: Path, device: torch.device) -> Any:
    """`torch.compile(model)`, compiled and warmed on the reference's own inputs before
    any timed call; its seconds go to `box/compiled.json`. A failure raises (the judge
    reports a reference error, the caller keeps eager's number)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(box / "inductor")
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # no compile workers beside the timing
    start = time.perf_counter()
    compiled = torch.compile(model)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    with torch.no_grad():
        for _ in range(2):
            compiled(*inputs)
    (box / "compiled.json").write_text(json.dumps({"s": time.perf_counter() - start}))
    return compiled


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


def _serve(harness: Harness) -> None:
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "load":
            harness.load(command["threads"])
            harness.emit(event="loaded")
        elif command["cmd"] == "call":
            harness.call(command)
        elif command["cmd"] == "late":
            harness.late(command)
        elif command["cmd"] == "report":
            harness.report()


def main(box: Path, role: str) -> None:
    events = os.fdopen(os.dup(1), "w")
    log = os.open(box / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.addaudithook(_audit)
    threading.setprofile(_library_probe)
    if json.loads(sys.stdin.readline() or "{}").get("cmd") != "job":  # started before its job
        os._exit(0)
    harness = Harness(box, role, events)
    try:
        _serve(harness)
    except SystemExit:
        pass
    except BaseException as error:  # every failure of the candidate becomes a verdict
        harness.emit(**_error_event(error, harness.candidate_path))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidates' atexit hooks cannot run


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
