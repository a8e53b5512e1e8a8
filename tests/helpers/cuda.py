"""The CUDA kernels embedded in a candidate, and compiling one with nvcc (no GPU needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from htam_engine import parsing

NVCC = shutil.which("nvcc")


def kernel_sources(python_source: str) -> list[str]:
    """The embedded CUDA sources holding kernels (the torch host wrapper is separate)."""
    return [
        e.text
        for e in parsing.embedded_sources(python_source)
        if e.language == "cuda" and "__global__" in e.text
    ]


def nvcc_compile(source: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """`nvcc -arch=sm_80 -cubin` on a kernel source (no torch headers needed)."""
    assert NVCC is not None
    path = workdir / "kernel.cu"
    path.write_text(source)
    command = [NVCC, "-arch=sm_80", "-cubin", str(path), "-o", str(workdir / "kernel.cubin")]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)
