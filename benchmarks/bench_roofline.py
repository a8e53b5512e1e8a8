"""How far from the machine's limit, and from torch.compile? The issue-28 measurements.

    .venv/bin/python benchmarks/bench_roofline.py [--tasks examples/softmax/reference.py ...]
        [--naive] [--no-compile] [--out FILE.json]

1. This machine's limits (`htam machine`, measured once and cached under the HTAM home).
2. The measured 1-thread bandwidth against numpy copying a 256 MiB array on the same
   core: torch's copy and numpy's, interleaved in this process, pinned to one core.
3. Why PyTorch's softmax sits where it does: 1 thread, 1024 x 4096 float32, against a
   copy of the same bytes, exp alone, and softmax into a preallocated output.
4. Per task (a reference .py): PyTorch's own fraction of the roofline (the reference timed
   here, 1 thread, median of 30) and torch.compile's speedup over eager (both timed in
   alternation, compile time excluded and printed). With `--naive`, each example's
   `cpu_naive.py` is also evaluated by the real evaluator (the verdict's `roofline`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from htam_engine import roofline  # noqa: E402
from htam_engine.placement import Placement  # noqa: E402

DEFAULT_TASKS = [
    *sorted(str(p) for p in (ROOT / "examples").glob("*/reference.py")),
    *sorted(str(p) for p in (ROOT / "tests/fixtures/kernelbench/level1").glob("*.py")),
]
MIB = 1 << 20


def _median_ms(run: Any, repeats: int = 30) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def numpy_versus_torch(rounds: int = 7) -> dict[str, float]:
    """Best GB/s of copying 256 MiB, numpy and torch alternating on one core."""
    import numpy as np
    import torch

    n = 256 * MIB // 4
    a, b = torch.ones(n), torch.empty(n)
    an, bn = a.numpy(), b.numpy()
    best = {"numpy": 0.0, "torch": 0.0}
    for _ in range(rounds):
        for name, run in (("numpy", lambda: np.copyto(bn, an)), ("torch", lambda: b.copy_(a))):
            start = time.perf_counter()
            run()
            best[name] = max(best[name], 2 * 256 * MIB / (time.perf_counter() - start) / 1e9)
    return best


def softmax_anatomy() -> dict[str, float]:
    """GB/s (16 MiB in, 16 MiB out) of softmax and of its parts, one thread."""
    import torch

    x = torch.randn(1024, 4096)
    y = torch.empty_like(x)
    moved = 2 * x.numel() * 4
    runs = {
        "copy": lambda: y.copy_(x),
        "exp_out": lambda: torch.exp(x, out=y),
        "softmax": lambda: torch.softmax(x, dim=1),
        "softmax_out": lambda: torch.ops.aten._softmax.out(x, 1, False, out=y),
        "max_only": lambda: torch.amax(x, dim=1),
    }
    found = {}
    for name, run in runs.items():
        ms = _median_ms(run)
        found[f"{name}_ms"] = round(ms, 4)
        found[f"{name}_gbs"] = round(moved / (ms / 1e3) / 1e9, 2)
    return found


def _reference(path: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"ref_{abs(hash(path))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_numbers(path: str, limits: roofline.MachineLimits, compile_too: bool) -> dict[str, Any]:
    import torch

    source = Path(path).read_text()
    work = roofline.task_work(source)
    module = _reference(path)
    model = module.Model(*module.get_init_inputs())
    inputs = list(module.get_inputs())
    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(*inputs))
        bound = roofline.bound_for(work, limits)
        assert bound is not None
        placed = roofline.place(work, bound, eager_ms)
        assert placed is not None
        found: dict[str, Any] = {
            "task": str(Path(path).relative_to(ROOT)),
            "bytes": work.bytes,
            "flops": work.flops,
            "bound": placed.bound,
            "roofline_ms": round(placed.roofline_ms, 5),
            "pytorch_ms": round(eager_ms, 5),
            "pytorch_fraction": placed.fraction,
            "pytorch_gbs": placed.achieved_gbs,
            "pytorch_gflops": placed.achieved_gflops,
        }
        if not compile_too:
            return found
        try:
            start = time.perf_counter()
            compiled = torch.compile(model)
            compiled(*inputs)
            found["compile_s"] = round(time.perf_counter() - start, 1)
        except Exception as error:  # say why inductor is unusable here
            found["compile_error"] = f"{type(error).__name__}: {error}"[:300]
            return found
        eager, fast = [], []
        for _ in range(15):  # alternating, as the evaluator pairs them
            eager.append(_median_ms(lambda: model(*inputs), 5))
            fast.append(_median_ms(lambda: compiled(*inputs), 5))
        found["compiled_ms"] = round(statistics.median(fast), 5)
        ratios = [e / f for e, f in zip(eager, fast, strict=True)]
        found["compile_speedup"] = round(statistics.median(ratios), 3)
        found["compiled_fraction"] = round(placed.roofline_ms / statistics.median(fast), 4)
    return found


def naive_verdicts() -> list[dict[str, Any]]:
    """Each example's cpu_naive.py through the real evaluator: the verdict's roofline."""
    from htam_engine.evaluate import evaluate
    from htam_engine.task import load_task

    rows = []
    for naive in sorted((ROOT / "examples").glob("*/cpu_naive.py")):
        task = load_task(naive)
        verdict = evaluate(task, task.impl_source or "", device="cpu", use_cache=False)
        light = verdict.roofline if isinstance(verdict.roofline, Placement) else None
        rows.append(
            {
                "task": str(naive.relative_to(ROOT)),
                "speedup": verdict.speedup,
                "runtime_ms": verdict.runtime_ms,
                "ref_runtime_ms": verdict.ref_runtime_ms,
                "naive_fraction": light.fraction if light else None,
                "pytorch_fraction": light.reference_fraction if light else None,
                "bound": light.bound if light else None,
                "error": verdict.error.message[:200] if verdict.error else None,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS)
    parser.add_argument("--naive", action="store_true", help="evaluate examples/*/cpu_naive.py")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    limits = roofline.machine_limits()
    print(roofline._human(limits), file=sys.stderr, flush=True)
    core = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": limits.to_json(), "load_before": os.getloadavg()[0]}
    results["copy_256mib_gbs"] = numpy_versus_torch()
    print(json.dumps(results["copy_256mib_gbs"]), file=sys.stderr, flush=True)
    results["softmax_anatomy"] = softmax_anatomy()
    print(json.dumps(results["softmax_anatomy"]), file=sys.stderr, flush=True)
    results["tasks"] = []
    for path in args.tasks:
        row = task_numbers(str(Path(path).resolve()), limits, not args.no_compile)
        results["tasks"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.naive:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        results["naive"] = naive_verdicts()
    results["load_after"] = os.getloadavg()[0]
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
