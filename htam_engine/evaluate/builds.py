"""Builds the trusted side keeps, so a candidate evaluated again reuses its own.

A candidate's C++ is compiled inside its sandboxed worker, into its own box (a build
folder candidates shared could be poisoned), so every re-timing of the same candidate
(an unconverged timing, a duel's runs, the start) compiled it again. Here the trusted
side keeps that folder: right after a compile, while the worker is stopped, it copies
the box's `build` folder out (plain files only, never a link, bounded), and keeps the
copy under `HTAM_HOME/box-builds/KEY` once the candidate was verified correct; the next
box of the same KEY gets a read-only copy before its worker loads (an entry whose
evaluation then fails is forgotten: the next one compiles afresh). KEY hashes all a
build depends on: the candidate file's name and bytes, the siblings copied beside it,
the device, the environment a worker gets (compiler, flags, paths) and the evaluator's
fingerprint (its code, HTAM's version, g++, nvcc, torch, Python). An entry is made once,
never written by a box (the HTAM home is hidden from every box; the box gets a copy),
so a build, even one a candidate tampered with, reaches only evaluations of the very
content that made it. Only under bwrap: without it a candidate can write the HTAM home.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import htam_engine
from htam_engine import machine
from htam_engine.digest import digest
from htam_engine.evaluate import cache
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.paths import subdir

FOLDER = "build"  # the box's folder `kernels.load_cpp` builds into (path-independent)
MAX_BYTES = 1 << 30  # all entries together; the least recently used go first
MAX_ENTRY_BYTES = 64 << 20  # one entry (a load_cpp library is tens of kB)
MAX_ENTRY_FILES = 256
_STAGING = ".staging-"
FORMAT = "htam-build-2"  # 2: injective keys; an entry of 1 is never found, then evicted


def enabled() -> bool:
    return sandbox_mode() == "bwrap"


def key(name: str, code: str, siblings: dict[str, str], device: str) -> str:
    """What a build in a box holding `code` as `name` (and `siblings`) depends on: the
    digest of one structure (injective: no sibling's text can pass for two siblings)."""
    env = machine.scrubbed_env(machine.WORKER_ENV)  # what the worker's compiler sees
    return digest(
        {
            "format": FORMAT,
            "htam": htam_engine.__version__,
            "fingerprint": cache.fingerprint(),
            "device": device,
            "name": name,
            "code": code,
            "siblings": siblings,
            "env": env,
        }
    )[:32]


def _root() -> Path:
    return subdir("box-builds")


def _copy(source: Path, target: Path, writable: bool) -> int | None:
    """Copy the plain files under `source` into `target` (made here), with their times;
    links and special files are skipped. The bytes copied, or None past the bounds."""
    total = files = 0
    for folder, dirs, names in os.walk(source):  # os.walk never follows a link
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
        into = target / Path(folder).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = Path(folder) / name
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                continue
            total, files = total + info.st_size, files + 1
            if total > MAX_ENTRY_BYTES or files > MAX_ENTRY_FILES:
                return None
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(descriptor, "rb") as src, open(into / name, "xb") as dst:
                shutil.copyfileobj(src, dst)
            os.utime(into / name, ns=(info.st_atime_ns, info.st_mtime_ns))
            mode = stat.S_IMODE(info.st_mode) | 0o444
            (into / name).chmod(mode if writable else mode & ~0o222)
    return total


@dataclass
class Box:
    """One worker box's build folder and the entry of its KEY: `reused` when the box was
    seeded from it, `staged` the copy taken after its compile, until kept or dropped."""

    folder: Path
    key: str
    reused: bool = False
    staged: Path | None = None

    def seed(self) -> None:
        """Copy the entry, if there is one, into the (empty) build folder, read-only."""
        entry = _root() / self.key
        try:
            if entry.is_dir() and _copy(entry, self.folder, writable=False) is not None:
                os.utime(entry)  # recently used
                self.reused = True
        except OSError:  # evicted meanwhile: build as if there were none
            self.reused = False
        if not self.reused:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(exist_ok=True)

    def stage(self) -> None:
        """Copy what the compile left in the build folder (the worker is stopped)."""
        if self.reused or not any(self.folder.iterdir()):
            return
        staged = Path(tempfile.mkdtemp(prefix=_STAGING, dir=_root()))
        with contextlib.suppress(OSError):
            if _copy(self.folder, staged / "entry", writable=True) is not None:
                self.staged = staged
                return
        shutil.rmtree(staged, ignore_errors=True)

    def keep(self) -> bool:
        """Make the staged copy the entry of its KEY (an entry is never replaced)."""
        staged, self.staged = self.staged, None
        if staged is None:
            return False
        try:
            (staged / "entry").rename(_root() / self.key)
            kept = True
        except OSError:  # another evaluation of the same content kept it first
            kept = False
        shutil.rmtree(staged, ignore_errors=True)
        if kept:
            evict()
        return kept

    def forget(self) -> None:
        """Remove the entry this box was seeded from (its evaluation failed)."""
        with contextlib.suppress(OSError):
            gone = (_root() / self.key).rename(_root() / f"{_STAGING}{self.key}")
            shutil.rmtree(gone, ignore_errors=True)

    def drop(self) -> None:
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None


def _size(entry: Path) -> int:
    return sum(p.lstat().st_size for p in entry.rglob("*") if p.is_file())


def evict(limit: int | None = None) -> list[str]:
    """Remove the least recently used entries until all fit in `limit` (`MAX_BYTES`), and
    staging folders left by dead evaluations; the keys removed."""
    limit = MAX_BYTES if limit is None else limit
    entries = []
    for path in _root().iterdir():
        with contextlib.suppress(OSError):
            if path.name.startswith(_STAGING):
                if time.time() - path.stat().st_mtime > 3600:
                    shutil.rmtree(path, ignore_errors=True)
                continue
            entries.append((path.stat().st_mtime, _size(path), path))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(path, ignore_errors=True)
        total -= size
        removed.append(path.name)
    return removed
