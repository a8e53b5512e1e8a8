"""The sandbox every process that reads, compiles or runs candidate-written text runs in
(a worker, the nvcc compile check): bubblewrap where it can run, else
none, and the same limits either way.

Under bwrap a command gets private PID, IPC, network, UTS and user namespaces, a
read-only view of the machine with the user's home, `HTAM_HOME`, `/tmp` and `/run`
hidden, one writable folder (its box), no capabilities, and dies with its parent; GPU
device nodes are bound only for CUDA. Either way it gets only the allowlisted
environment, an address-space cap and a file-size cap (`limits`), its own process group,
a death signal, and a trusted subreaper (`reaper.py`) that keeps every process it
creates in its tree and caps their number. Without bwrap the file system and other
processes stay reachable.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import resource
import shutil
import signal
import site
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import htam_engine
from htam_engine import machine
from htam_engine.paths import home

MODES = ("bwrap", "none")
_PACKAGE_ROOT = str(Path(htam_engine.__file__).resolve().parent.parent)
_HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/run", "/dev/shm", "/mnt", "/media")


def _bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def sandbox_mode() -> str:
    """`bwrap` if a bubblewrap sandbox starts on this machine, else `none` (probed once per
    process; `HTAM_SANDBOX=none` forces the fallback)."""
    if os.environ.get("HTAM_SANDBOX") == "none" or _bwrap() is None:
        return "none"
    probe = _bwrap_argv(Path("/"), "cpu") + ["true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    return "bwrap" if done.returncode == 0 else "none"


# glibc's malloc moves its mmap threshold as blocks are freed, so whether a call's large
# output comes from fresh pages (a page fault per 4 KiB: +4 ms on a 16 MB softmax) or from
# reused heap depends on the order of earlier frees, and a whole run lands in one mode or
# the other (0.27x or 0.45x for the same kernel). A fixed threshold (its 32 MiB maximum)
# and no trimming make every call after warm-up reuse memory, as a long-running process
# does; blocks over 32 MiB are always fresh pages, on both sides alike.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def environment(box: Path, threads: int) -> dict[str, str]:
    """The whole environment of a worker: no keys, tokens or `HTAM_*`, home in its box
    (the worker tells `kernels` where to build)."""
    env = machine.scrubbed_env(machine.WORKER_ENV)
    env.update(
        HOME=str(box),
        TMPDIR=str(box / "tmp") if sandbox_mode() == "none" else "/tmp",
        XDG_CACHE_HOME=str(box / "cache"),
        TORCH_EXTENSIONS_DIR=str(box / "torch_extensions"),
        TRITON_CACHE_DIR=str(box / "triton"),
        PYTHONPATH=_PACKAGE_ROOT,  # the worker runs the judge's HTAM, not another install
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        **STEADY_MALLOC,
    )
    return env


def _needed() -> list[str]:
    """Paths the worker's interpreter and packages live in (re-exposed if hidden)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        str(Path(sys.executable).resolve().parent),
        _PACKAGE_ROOT,
        *site.getsitepackages(),
    }
    return sorted(p for p in paths if os.path.isdir(p))


def _hidden() -> list[str]:
    hidden = [*_HIDDEN, os.path.expanduser("~"), str(home().resolve())]
    return [p for p in dict.fromkeys(hidden) if os.path.isdir(p) and p != "/"]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _bwrap_argv(box: Path, device: str) -> list[str]:
    argv = [_bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    hidden = _hidden()
    for folder in hidden:
        argv += ["--tmpfs", folder]
    for path in _needed():
        if any(_under(path, folder) for folder in hidden):
            argv += ["--ro-bind", path, path]
    if box != Path("/"):
        argv += ["--bind", str(box), str(box), "--chdir", str(box)]
    if device == "cuda":
        for node in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", node, node]
    argv += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    return [*argv, "--die-with-parent", "--new-session", "--"]


# Files next to the candidate that it names: copied into its box, read-only (an honest
# `cpp_extension.load` of a sibling `.cpp`); never through a link, never a large file.
SIBLING_SUFFIXES = frozenset({".cpp", ".cc", ".cxx", ".c", ".cu", ".cuh", ".h", ".hpp"})
MAX_SIBLING_BYTES = 1 << 20


def named_siblings(candidate: Path | None, source: str) -> dict[str, str]:
    """The source files next to `candidate` whose names `source` mentions, by name."""
    if candidate is None or not candidate.parent.is_dir():
        return {}
    found = {}
    for path in sorted(candidate.parent.iterdir()):
        if path.suffix not in SIBLING_SUFFIXES or path.name not in source or path == candidate:
            continue
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if (
                path.is_file()
                and not path.is_symlink()
                and path.stat().st_size <= MAX_SIBLING_BYTES
            ):
                found[path.name] = path.read_text()
    return found


def place_siblings(siblings: dict[str, str], folder: Path) -> None:
    """Write `siblings` into the box's `folder`, read-only."""
    for name, text in siblings.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o444)


MAX_PROCESSES = 256  # below one reaper: a compiler tree needs a dozen
MAX_FILE_MB = 4096  # one file a sandboxed command writes (a build's objects: ~100 MB)
REAPER = str(Path(__file__).with_name("reaper.py"))
_PR_SET_PDEATHSIG = 1


def command(argv: list[str], box: Path, device: str, resident_mb: int = 0) -> list[str]:
    """`argv` as it runs in the sandbox of `box`, below its reaper, its whole tree held
    to `resident_mb` of memory together (0: no cap)."""
    reaper = [sys.executable, "-I", "-S", REAPER, str(MAX_PROCESSES), str(resident_mb), "--"]
    if sandbox_mode() == "bwrap":
        return reaper + _bwrap_argv(box, device) + argv
    return reaper + argv


def limits(memory_mb: int | None, death_signal: int = signal.SIGTERM) -> Callable[[], None]:
    """The `preexec_fn` of a sandboxed command (run in the child before exec): the
    address-space cap (none on a GPU: the CUDA driver maps far more than it uses), the
    file-size cap, and `death_signal` when its parent dies, even of SIGKILL (the reaper
    takes SIGTERM as the order to kill its whole tree)."""

    def apply() -> None:
        if memory_mb:
            size = memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        size = MAX_FILE_MB << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, death_signal)

    return apply


@dataclass(frozen=True)
class Ran:
    """How a one-shot sandboxed command ended: its exit status (None: killed at its
    time limit) and the first `output_cap` bytes of its output."""

    returncode: int | None
    output: str


def run(
    argv: list[str],
    box: Path,
    *,
    timeout_s: float,
    memory_mb: int | None,
    resident_mb: int = 0,
    device: str = "cpu",
    input_text: str = "",
    output_cap: int = 64 << 10,
) -> Ran:
    """Run `argv` once in the sandbox of `box` (its home, cwd and only writable folder)
    with `input_text` on stdin; stdout and stderr together, capped (the rest is read and
    dropped). Killed with its whole tree at `timeout_s`, past `resident_mb` together
    (`reaper.OVER_MEMORY`), or when this process dies; `memory_mb` caps each process's
    address space."""
    (box / "tmp").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        command(argv, box, device, resident_mb),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment(box, 1),
        cwd=box,
        start_new_session=True,
        preexec_fn=limits(memory_mb),
    )
    kept = bytearray()

    def read() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            kept.extend(chunk[: max(0, output_cap - len(kept))])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert proc.stdin is not None
    with contextlib.suppress(OSError):
        proc.stdin.write(input_text.encode())
        proc.stdin.close()
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
        stop(proc)
    machine.kill_process_group(proc.pid)
    proc.wait()
    reader.join(timeout=5)
    return Ran(code, kept.decode(errors="replace"))


def stop(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """Stop a sandboxed command: its reaper kills the whole tree (processes that left
    its group included), then the group is killed, reaper and all."""
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    machine.kill_process_group(proc.pid)
