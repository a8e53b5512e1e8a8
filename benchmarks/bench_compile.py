"""Compile cost per candidate, cold and warm, for each candidate form the evaluator runs.

    .venv/bin/python benchmarks/bench_compile.py [--json]

Each measurement runs in a fresh Python process (as an evaluation worker does) and
times only the build-and-load call, not the torch import:

- `load_cpp`: the light CPU form (g++ + ctypes, no torch headers), cold (empty build
  dir) and warm (same dir: the library is reused by content hash);
- `load_inline` before: plain `load_inline` (C++ with torch headers) in a fresh
  extensions dir, which every evaluation paid (each worker has its own dir);
- `load_inline` after: through the evaluator's `common.share_inline_builds` (a build
  dir keyed by the hash of the arguments): a source never seen (cold) and the same
  source again from a new process (warm).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

KERNEL = r"""
extern "C" void scale(const float* x, float* y, long n, float s) {
    for (long i = 0; i < n; ++i) y[i] = s * x[i];
}
"""
INLINE = r"""
#include <torch/extension.h>
torch::Tensor scale(torch::Tensor x, double s) { return x * s + %r; }
"""
_PROBE = """
import json, sys, time
{setup}
start = time.perf_counter()
{call}
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""
_SHARED = (
    "from htam_engine.evaluate.common import share_inline_builds\n"
    "share_inline_builds()\n"
    "from torch.utils.cpp_extension import load_inline"
)


def _measure(setup: str, call: str, env: dict[str, str]) -> float:
    code = _PROBE.format(setup=setup, call=call)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def _inline_call(name: str) -> str:
    source = INLINE % float(uuid.uuid4().int % 1000)  # a source no build dir has seen
    return f"load_inline({name!r}, cpp_sources={source!r}, functions=['scale'])"


def bench_load_cpp(root: Path) -> dict[str, float]:
    env = {**os.environ, "HTAM_BUILD_DIR": str(root / "cpp")}
    setup = "from htam_engine.kernels import load_cpp"
    call = f"load_cpp('scale', {KERNEL!r}, ['-O2'])"
    return {"cold_s": _measure(setup, call, env), "warm_s": _measure(setup, call, env)}


def bench_load_inline(root: Path) -> dict[str, float]:
    before_env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root / "before")}
    before = _measure(
        "from torch.utils.cpp_extension import load_inline",
        _inline_call("scale_before"),
        before_env,
    )
    after_env = {**os.environ, "HTAM_HOME": str(root / "home")}
    call = _inline_call("scale_after")
    return {
        "before_every_eval_s": before,
        "after_cold_s": _measure(_SHARED, call, after_env),
        "after_warm_s": _measure(_SHARED, call, after_env),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        results = {"load_cpp": bench_load_cpp(root), "load_inline": bench_load_inline(root)}
    if args.json:
        print(json.dumps(results))
        return
    for form, numbers in results.items():
        print(form, "  ".join(f"{name}={value:.2f}" for name, value in numbers.items()))


if __name__ == "__main__":
    main()
