"""Compile-check CUDA sources with `nvcc -c` where no GPU can run them."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from pathlib import Path

ARCH = "sm_80"


def cuda_source(candidate: str, kind: str) -> str | None:
    """The CUDA code of a candidate: the file itself, or the `load_inline` string holding
    `__global__` in a Python candidate."""
    if kind == "cu":
        return candidate
    try:
        tree = ast.parse(candidate)
    except SyntaxError:
        return None
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    return next((t for t in texts if isinstance(t, str) and "__global__" in t), None)


def _include_flags() -> list[str]:
    spec = importlib.util.find_spec("torch")
    flags = [f"-I{sysconfig.get_paths()['include']}"]
    if spec and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations))) / "include"
        flags += [f"-I{root}", f"-I{root / 'torch' / 'csrc' / 'api' / 'include'}"]
    return flags


def nvcc_check(source: str, timeout_s: float) -> tuple[bool, str]:
    """(compiled, log): `nvcc -arch=sm_80 -c` on `source` with the torch headers reachable."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False, "nvcc not found on PATH"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "kernel.cu"
        path.write_text(source)
        command = [
            nvcc,
            f"-arch={ARCH}",
            "-std=c++17",
            *_include_flags(),
            "-c",
            str(path),
            "-o",
            str(Path(scratch) / "kernel.o"),
        ]
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False, f"nvcc exceeded {timeout_s:g} s"
    return proc.returncode == 0, log.replace(str(path), "kernel.cu")
