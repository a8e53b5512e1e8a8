"""A light candidate form for CPU kernels: plain C++ compiled with g++, called by ctypes.

`torch.utils.cpp_extension.load_inline` compiles against the torch headers and takes
20-75 s per candidate on a small machine; a C++ file with `extern "C"` functions and
no torch headers compiles in well under a second. Candidates call `load_cpp` from their
`ModelNew` and pass `tensor.data_ptr()` to the functions.

Builds are cached by the hash of (source, flags, compiler) under the folder given to
`use_build_dir` (the evaluator's worker gives its own box: a cache that candidates share
could be poisoned), else `$HTAM_BUILD_DIR` or the HTAM home, so an unchanged kernel
never compiles twice there.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from htam_engine.digest import digest

DEFAULT_CFLAGS = ("-O2",)


class CompileError(RuntimeError):
    """The compiler rejected the source; `log` holds its output."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


_build_dir: Path | None = None


def use_build_dir(folder: Path) -> None:
    """Build into `folder` from now on in this process."""
    global _build_dir
    _build_dir = folder


def _build_root() -> Path:
    override = _build_dir or os.environ.get("HTAM_BUILD_DIR")
    if override:
        root = Path(override)
    else:
        from htam_engine.paths import subdir

        root = subdir("builds")
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_cpp(source: str, extra_cflags: list[str] | tuple[str, ...] = DEFAULT_CFLAGS) -> Path:
    """Compile `source` into a shared library (cached by content hash) and return its path."""
    compiler = os.environ.get("CXX", "g++")
    flags = [*extra_cflags, "-shared", "-fPIC", "-std=c++17"]
    key = digest({"compiler": compiler, "flags": flags, "source": source})[:24]  # injective
    library = _build_root() / f"htam_{key}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        src = Path(scratch) / "kernel.cpp"
        src.write_text(source)
        out = Path(scratch) / "kernel.so"
        proc = subprocess.run(
            [compiler, *flags, str(src), "-o", str(out)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise CompileError(f"{compiler} failed with exit code {proc.returncode}", proc.stderr)
        shutil.move(str(out), library)  # atomic within one filesystem
    return library


def load_cpp(
    name: str, source: str, extra_cflags: list[str] | tuple[str, ...] = DEFAULT_CFLAGS
) -> ctypes.CDLL:
    """Compile (or reuse) `source` and load it; `name` is only for messages."""
    try:
        return ctypes.CDLL(str(build_cpp(source, extra_cflags)))
    except CompileError as error:
        raise CompileError(f"building {name!r}: {error}", error.log) from None
