"""Verdicts cached by content hash of task, candidate, device and environment.

Values are JSON strings (never pickles) in a diskcache under the HTAM home.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import diskcache

from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.task import Task


def evaluator_version() -> str:
    """Hash of the evaluator's own code: a change of rules (a new check, a tolerance)
    must never be answered by a verdict the old rules gave."""
    package = Path(__file__).parent
    files = sorted(package.glob("*.py")) + [package.parent / "kernels.py"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _tool(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return "absent"
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _hardware() -> str:
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next((ln for ln in cpuinfo.read_text().splitlines() if "model name" in ln), "")
    gpus = Path("/proc/driver/nvidia/gpus")
    names = sorted(p.name for p in gpus.iterdir()) if gpus.is_dir() else []
    return f"{platform.machine()}|{cpu}|{','.join(names)}"


@functools.cache
def fingerprint() -> str:
    """What a timing or a verdict depends on besides the code."""
    return "|".join(
        [
            evaluator_version(),
            sys.version,
            _version("torch"),
            _hardware(),
            _tool(["g++", "-dumpfullversion"]),
            _tool(["nvcc", "--version"]).splitlines()[-1:][0]
            if shutil.which("nvcc")
            else "no-nvcc",
        ]
    )


def key(task: Task, candidate: str, device: str, limits: Limits) -> str:
    parts = [
        task.reference_source,
        task.kind,
        task.entry or "",
        candidate,
        device,
        json.dumps(asdict(limits), sort_keys=True),
        fingerprint(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _open() -> diskcache.Cache:
    return diskcache.Cache(str(subdir("eval-cache")))


def get(cache_key: str) -> Verdict | None:
    with _open() as store:
        text = store.get(cache_key)
    if not isinstance(text, str):
        return None
    verdict = Verdict.from_json(json.loads(text))
    verdict.cached = True
    return verdict


def put(cache_key: str, verdict: Verdict) -> None:
    with _open() as store:
        store.set(cache_key, json.dumps(verdict.to_json()))
