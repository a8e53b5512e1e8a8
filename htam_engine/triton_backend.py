"""What evaluating a Triton candidate needs beyond a CUDA one.

On a machine without a CUDA device a Triton candidate runs under Triton's interpreter
(`TRITON_INTERPRET=1`, numpy on the CPU): it is verified like any candidate and never
timed, because interpreter times say nothing about the kernel. On a CUDA device it is
compiled and timed like CUDA. Nothing here imports triton until a worker asks for it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from htam_engine import parsing

INSTALL_HINT = "install htam[triton]"
MIN_VERSION = (3, 2)  # the `triton>=3.2` of the extra
NOT_TIMED = "not timed: Triton interpreter"
CORRECTNESS_ONLY = (
    "correctness only: Triton kernels run under Triton's interpreter on a CPU and are not "
    "timed, so this run learns which strategies give correct code, not which are faster"
)


def missing() -> str | None:
    """None when a usable Triton is installed here, else what is wrong and the fix."""
    if importlib.util.find_spec("triton") is None:
        return f"Triton is not installed: {INSTALL_HINT} (pip install 'htam[triton]')"
    version = importlib.metadata.version("triton")
    if _release(version) < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        return f"Triton {version} is too old (need >= {wanted}): {INSTALL_HINT}"
    return None


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "3.9.0" or "3.2.0+git1a2b"."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def interpreted(device: str) -> bool:
    """Triton runs compiled only on a CUDA device; anywhere else under the interpreter."""
    return device != "cuda"


def environment(device: str, scratch: Path) -> dict[str, str]:
    """Variables a Triton candidate's process needs: its caches inside the sandbox's one
    writable folder (there is no home directory), and the interpreter off a GPU."""
    env = {"TRITON_HOME": str(scratch), "TRITON_CACHE_DIR": str(scratch / "triton-cache")}
    if interpreted(device):
        env["TRITON_INTERPRET"] = "1"
    return env


def timing_note(backend: str, device: str) -> str | None:
    """Why a candidate is not timed (the verdict's note), or None when it is timed."""
    return NOT_TIMED if backend == "triton" and interpreted(device) else None


def unlaunched(source: str) -> str | None:
    """Why a Triton candidate is not a custom kernel (no `@triton.jit` kernel launched from
    a function), or None. Torch doing the work is static.torch_compute's to catch."""
    units = [u for u in parsing.kernels(source, "python") if u.kind == "triton"]
    if not units:
        return "no @triton.jit kernel in the candidate"
    if not any(u.launchers for u in units):
        names = ", ".join(u.name for u in units)
        return f"the @triton.jit kernels ({names}) are never launched (kernel[grid](...))"
    return None


Benchmark = Callable[..., list[float]]


def first_config(
    kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5,)
) -> list[float]:
    """An autotuning "benchmark" for the interpreter: the same time for every config
    without running it, so the first config is kept and the candidate runs once per
    call. Interpreter times would pick a config at random, and running every config
    multiplies the verification time by the config count."""
    return [0.0 for _ in quantiles]


def prepare_interpreter(benchmark: Benchmark = first_config) -> None:
    """Call in the candidate's process, with TRITON_INTERPRET=1 set and before the
    candidate is imported: `@triton.autotune` otherwise asks for a GPU driver to time its
    configs and every autotuned candidate crashes on a CPU. On a CPU the first config is
    the one verified; on a GPU every config is timed and the chosen one verified."""
    from triton.runtime.autotuner import Autotuner

    Autotuner.do_bench = staticmethod(benchmark)  # type: ignore[assignment]
