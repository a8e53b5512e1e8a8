"""Compile cost per candidate: cold and warm, for each candidate form the evaluator runs.

    .venv/bin/python benchmarks/bench_compile.py [--pch] [--json]

Each measurement runs in a fresh Python process (as an evaluation worker does) and
times only the build-and-load call, not the torch import:

- `load_cpp`: the light CPU form (g++ + ctypes, no torch headers), cold (empty build
  dir) and warm (same dir: the library is reused by content hash);
- `load_inline` (CPU C++ with torch headers): cold, which is what every evaluation paid
  before builds were shared (each worker has its own extensions dir), and warm through
  the evaluator's hash-keyed shared build dir (`common.share_inline_builds`);
- with `--pch`, `load_inline(use_pch=True)`: the first build (makes the header) and a
  second, different source reusing it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL = r"""
extern "C" void scale(const float* x, float* y, long n, float s) {
    for (long i = 0; i < n; ++i) y[i] = s * x[i];
}
"""
INLINE = r"""
#include <torch/extension.h>
torch::Tensor scale(torch::Tensor x, double s) { return x * s; }
"""
_PROBE = """
import json, sys, time
{setup}
start = time.perf_counter()
{call}
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""


def _measure(setup: str, call: str, env: dict[str, str]) -> float:
    code = _PROBE.format(setup=setup, call=call)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def bench_load_cpp(root: Path) -> dict[str, float]:
    env = {**os.environ, "HTAM_BUILD_DIR": str(root / "cpp")}
    setup = "from htam_engine.kernels import load_cpp"
    call = f"load_cpp('scale', {KERNEL!r}, ['-O2'])"
    return {"cold_s": _measure(setup, call, env), "warm_s": _measure(setup, call, env)}


def bench_load_inline(root: Path) -> dict[str, float]:
    """Cold: an empty shared build dir (what every evaluation paid before builds were
    shared, since each worker has its own extensions dir). Warm: the same source again
    in a new process, found in the hash-keyed shared dir."""
    setup = (
        "from htam_engine.evaluate.common import share_inline_builds\n"
        "share_inline_builds()\n"
        "from torch.utils.cpp_extension import load_inline"
    )
    call = f"load_inline('scale_inline', cpp_sources={INLINE!r}, functions=['scale'])"
    env = {**os.environ, "HTAM_HOME": str(root / "home")}
    return {"cold_s": _measure(setup, call, env), "warm_s": _measure(setup, call, env)}


def bench_pch(root: Path) -> dict[str, float]:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root / "pch")}
    setup = "from torch.utils.cpp_extension import load_inline"
    first = f"load_inline('pch_a', cpp_sources={INLINE!r}, functions=['scale'], use_pch=True)"
    other = INLINE.replace("x * s", "x * s + 0")
    second = f"load_inline('pch_b', cpp_sources={other!r}, functions=['scale'], use_pch=True)"
    return {"first_s": _measure(setup, first, env), "next_source_s": _measure(setup, second, env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pch", action="store_true", help="also measure use_pch=True")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        results = {"load_cpp": bench_load_cpp(root), "load_inline": bench_load_inline(root)}
        if args.pch:
            results["load_inline_pch"] = bench_pch(root)
    if args.json:
        print(json.dumps(results))
        return
    for form, numbers in results.items():
        print(form, "  ".join(f"{name}={value:.2f}" for name, value in numbers.items()))


if __name__ == "__main__":
    main()
