"""How much memory a problem needs, estimated before anything runs, and the refusal of a
problem this machine cannot hold (`--scale` shrinks it, see `task.scale_reference`).

The estimate comes from the judge the problem's evaluation takes (`runner.size_problem`),
started ahead and held: beside its workers' start it imports the reference and calls
`get_inputs()` and the reference's forward under `torch.device("meta")` (shapes and dtypes
without a byte allocated), before it makes any input set. The judge runs the reference
anyway (it is trusted, see `judge`), and this caller imports no torch. A problem that
cannot run on meta tensors gets no estimate (nothing is refused on a guess). Estimates are
kept under the HTAM home by content.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from htam_engine import machine
from htam_engine.errors import TooLarge
from htam_engine.evaluate import runner
from htam_engine.evaluate.verdict import Limits, sets_ahead
from htam_engine.paths import subdir, write_whole
from htam_engine.task import SCALED_SIZES, Task, scale_reference

GB = 1e9


@dataclass(frozen=True)
class Estimate:
    """Bytes of one input set and of its outputs (None: unknown, and why), and each
    input's dtype and shape ("float32[64, 4096]"; empty where unknown)."""

    inputs: int | None
    outputs: int | None
    why: str = ""
    shapes: tuple[str, ...] = ()

    def needs(self, limits: Limits) -> dict[str, int]:
        """What an evaluation holds, per place. A worker maps the input and output
        buffers and holds its result (inputs + 2 x outputs); the judge keeps every input
        set, its expected outputs and their float64 copies (about 3 x a set per set) and
        timing's input sets made ahead, and both workers run beside it; the two boxes'
        buffers lie on disk."""
        inputs, outputs = self.inputs or 0, self.outputs or 0
        worker = inputs + 2 * outputs
        judge = 3 * limits.input_sets * (inputs + outputs)
        judge += sets_ahead(limits.inputs_ahead_mb, inputs) * inputs
        return {
            "worker": worker,
            "host": judge + 2 * worker,
            "disk": 2 * (inputs + outputs),
            "device": 3 * worker,
        }


def _kept_at(task: Task) -> Path:
    digest = hashlib.sha256(task.reference_source.encode()).hexdigest()[:24]
    return subdir("sizes") / f"{digest}.json"


def estimate(task: Task, device: str = "auto", limits: Limits | None = None) -> Estimate:
    """The sizes of `task`'s problem as it will run (scaled, if it is) on `device`."""
    path = _kept_at(task)
    try:
        kept = json.loads(path.read_text())
        if kept.get("shapes"):  # one kept before shapes were: asked again
            return Estimate(**(kept | {"shapes": tuple(kept["shapes"])}))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    sized = runner.size_problem(task, device, limits)
    result = Estimate(sized.inputs, sized.outputs, sized.why, tuple(sized.shapes))
    if result.inputs is not None:  # measured: kept (an unknown is asked again, cheaply)
        write_whole(path, json.dumps(result.__dict__))
    return result


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _free_gpu_memory() -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        query = ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=10)
        return int(done.stdout.split()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def limits_here(device: str, limits: Limits) -> dict[str, tuple[int | None, str]]:
    """What this machine gives an evaluation, per place, and what sets it."""
    found: dict[str, tuple[int | None, str]] = {
        "host": (_available_memory(), "available memory"),
        "disk": (shutil.disk_usage(subdir("jobs")).free, f"free disk under {subdir('jobs')}"),
    }
    if device == "cpu":
        found["worker"] = (limits.memory_mb * 2**20, "a worker's cap (Limits.memory_mb)")
    else:
        found["device"] = (_free_gpu_memory(), "free GPU memory")
    return found


def _gb(size: float) -> str:
    return f"{size / GB:.1f} GB" if size >= GB / 10 else f"{size / 1e6:.1f} MB"


def refuse_if_too_large(task: Task, device: str, limits: Limits | None = None) -> Estimate:
    """Raise `TooLarge` when the problem, as it will run, needs more than this machine
    gives an evaluation; the message names the estimate, the limit and a `--scale`."""
    limits = limits or Limits()
    found = estimate(task, device, limits)
    if found.inputs is None:
        return found
    needs = found.needs(limits)
    here = limits_here(machine.resolve_device(device, task.backend), limits)
    over = [
        (place, needs[place], limit, what)
        for place, (limit, what) in here.items()
        if limit is not None and needs[place] > limit
    ]
    if not over:
        return found
    outputs = _gb(found.outputs) if found.outputs is not None else "unknown"
    parts = [
        f"{place} needs ~{_gb(need)}, {what} is {_gb(limit)}" for place, need, limit, what in over
    ]
    message = (
        f"{task.name} is too large for this machine: one input set is {_gb(found.inputs)} "
        f"(outputs {outputs}); {'; '.join(parts)}"
    )
    factor = task.scale * min(limit / need for _, need, limit, _ in over) * 0.8
    suggestion = float(f"{factor:.1g}")
    if not scale_reference(task.reference_source, 0.5)[1]:
        message += f"; it has no size named {', '.join(SCALED_SIZES)} that --scale could shrink"
    elif suggestion > 0:
        message += f"; run it scaled down, e.g. --scale {suggestion:g} ({_sizes(task)})"
    raise TooLarge(message)


def _sizes(task: Task) -> str:
    """The sizes `--scale` shrinks in this problem, as written."""
    names = [name for name, _, _ in task.scaled] or [
        name for name, _, _ in scale_reference(task.reference_source, 0.5)[1]
    ]
    return "shrinks " + ", ".join(names)
