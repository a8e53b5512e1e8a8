"""Which CPU thread count gives timings that hold on a busy machine?

    .venv/bin/python benchmarks/bench_threads.py [--repeats 200] [--out FILE.json]

PyTorch's intra-op pool spin-waits for its threads; when another process takes a core,
a 2-thread op waits for a descheduled thread and its time jumps by 10-100x. This times a
512x1024 softmax (PyTorch's, as a reference is timed) with 1 thread and with every core,
alone and next to a neighbour that keeps one core busy, and reports the median, the
spread (p90/p10) and how much the neighbour slows each setting.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


def time_softmax(threads: int, repeats: int) -> list[float]:
    import torch

    torch.set_num_threads(threads)
    x = torch.randn(512, 1024)
    for _ in range(10):
        torch.softmax(x, dim=1)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.softmax(x, dim=1)
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(times, n=10)
    return {"median_ms": 1e3 * statistics.median(times), "p90_over_p10": deciles[8] / deciles[0]}


def measure(threads: int, busy: bool, repeats: int) -> dict[str, float]:
    stop = multiprocessing.Event()
    neighbour = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
    if busy:
        neighbour.start()
        time.sleep(0.2)
    try:
        return summary(time_softmax(threads, repeats))
    finally:
        stop.set()
        if busy:
            neighbour.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    for threads in sorted({1, cores}):
        idle = measure(threads, False, args.repeats)
        busy = measure(threads, True, args.repeats)
        slowdown = busy["median_ms"] / idle["median_ms"]
        rows.append({"threads": threads, "idle": idle, "busy": busy, "slowdown": slowdown})
    lines = [
        f"512x1024 softmax, {args.repeats} calls; neighbour: one process spinning on a core "
        f"({cores} cores)",
        "",
        "| threads | idle median ms | idle p90/p10 | busy median ms | busy p90/p10 | busy / idle |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['idle']['median_ms']:.3f} | {r['idle']['p90_over_p10']:.2f} "
            f"| {r['busy']['median_ms']:.3f} | {r['busy']['p90_over_p10']:.2f} "
            f"| {r['slowdown']:.2f}x |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"cores": cores, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
