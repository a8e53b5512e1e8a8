"""The sandbox every candidate process runs in: bubblewrap where it can run, else none.

Under bwrap a worker gets private PID, IPC, network, UTS and user namespaces, a read-only
view of the machine with the user's home, `HTAM_HOME`, `/tmp` and `/run` hidden, one
writable folder (its box), no capabilities, and dies with its parent (the judge); GPU
device nodes are bound only for CUDA. Without bwrap the same scrubbed environment and
memory cap apply, but the file system and other processes stay reachable.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import htam_engine
from htam_engine import machine
from htam_engine.paths import home

MODES = ("bwrap", "none")
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
        str(Path(htam_engine.__file__).resolve().parent.parent),
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


def command(argv: list[str], box: Path, device: str) -> list[str]:
    """`argv` as it runs in the sandbox of `box` (unchanged when there is none)."""
    if sandbox_mode() == "bwrap":
        return _bwrap_argv(box, device) + argv
    return argv
