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
import functools
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from htam_engine.digest import digest

DEFAULT_CFLAGS = ("-O2",)
LIBRARY_FLAGS = ("-shared", "-fPIC", "-std=c++17")  # after the caller's flags
VECTOR_REPORT = ".vec.txt"  # beside a library: what GCC's vectorizer did with its loops
REPORT_LINES = 12
_REMARK = re.compile(r"kernel\.cpp:(\d+):\d+: (?:optimized|missed): +(.*)")


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


@functools.cache
def toolchain() -> str:
    """ "g++ 12.2.0, glibc 2.36": what builds and links a candidate here ("" unknown)."""
    compiler = os.environ.get("CXX", "g++")
    try:
        done = subprocess.run([compiler, "-dumpfullversion"], capture_output=True, text=True,
                              timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    libc, version = platform.libc_ver()
    found = [f"{Path(compiler).name} {done.stdout.strip()}" if done.returncode == 0 else ""]
    return ", ".join(part for part in [*found, f"{libc} {version}" if libc else ""] if part)


def build_cpp(source: str, extra_cflags: list[str] | tuple[str, ...] = DEFAULT_CFLAGS) -> Path:
    """Compile `source` into a shared library (cached by content hash) and return its path."""
    compiler = os.environ.get("CXX", "g++")
    flags = [*extra_cflags, *LIBRARY_FLAGS]
    key = digest({"compiler": compiler, "flags": flags, "source": source})[:24]  # injective
    library = _build_root() / f"htam_{key}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        src = Path(scratch) / "kernel.cpp"
        src.write_text(source)
        out, remarks = Path(scratch) / "kernel.so", Path(scratch) / "remarks.txt"
        report = [f"-fopt-info-vec-all={remarks}"] if "g++" in Path(compiler).name else []
        proc = subprocess.run(
            [compiler, *flags, *report, str(src), "-o", str(out)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise CompileError(f"{compiler} failed with exit code {proc.returncode}", proc.stderr)
        if remarks.exists():
            text = vectorizer_report(remarks.read_text(errors="replace"), source)
            library.with_suffix(VECTOR_REPORT).write_text(text)
        shutil.move(str(out), library)  # atomic within one filesystem
    return library


def vectorizer_report(remarks: str, source: str) -> str:
    """GCC's `-fopt-info-vec` remarks on `source`, one line a loop: its line, its text and
    what the vectorizer did ("vectorized using 64 byte vectors", or why not)."""
    lines = source.splitlines()
    found: dict[int, list[str]] = {}
    for match in _REMARK.finditer(remarks):
        number, said = int(match.group(1)), match.group(2).strip()
        if said.startswith(("loop vectorized", "couldn't vectorize", "not vectorized")):
            kept = found.setdefault(number, [])
            if said not in kept:
                kept.append(said)
    shown = []
    for number, said in sorted(found.items())[:REPORT_LINES]:
        code = lines[number - 1].strip()[:60] if 0 < number <= len(lines) else ""
        shown.append(f"line {number} `{code}`: {'; '.join(said[:2])}")
    return "\n".join(shown)


def load_cpp(
    name: str, source: str, extra_cflags: list[str] | tuple[str, ...] = DEFAULT_CFLAGS
) -> ctypes.CDLL:
    """Compile (or reuse) `source` and load it; `name` is only for messages."""
    try:
        return ctypes.CDLL(str(build_cpp(source, extra_cflags)))
    except CompileError as error:
        raise CompileError(f"building {name!r}: {error}", error.log) from None
