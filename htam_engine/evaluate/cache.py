"""Verdicts cached by content hash of task, candidate, device, sandbox and environment.

The cache is one SQLite table under `HTAM_HOME/eval-cache/`, which the sandbox hides from
every candidate process. A row is a JSON record (never a pickle: a row that is not JSON
is ignored, never interpreted) holding the verdict and the conditions it was measured
under: the evaluator's own code hash, the sandbox mode, the environment fingerprint.
A record is answered only for exactly those conditions.

A cached verdict may be shown and learned from; whether a speedup may be *measured
against* it is `usable_as_baseline`: only a clean, timed, correct verdict, and never a
cached one recorded without a sandbox (a candidate could have written it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from htam_engine import database
from htam_engine.digest import digest
from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.task import Task, allowed_ops

RECORD_FORMAT = "htam-verdict-2"  # 2: injective keys; a row of 1 is never read
DB_NAME = "verdicts.sqlite3"
UNSANDBOXED = "none"
BUSY_TIMEOUT_S = 30.0


IMPORTED = (
    "database", "digest", "errors", "formatting", "kernels", "literals", "machine", "paths",
    "placement", "procs", "roofline", "stats", "task", "triton_backend", "vocabulary",
)  # fmt: skip  # HTAM's modules that the evaluator imports (`evaluator_files`)


def evaluator_files() -> list[Path]:
    """The evaluator's code: this package, `parsing`, and every other module of HTAM it
    imports (a tolerance lives in `vocabulary`, a timing's stopping rule in `stats`)."""
    package = Path(__file__).parent
    root = package.parent
    files = [*sorted(package.glob("*.py")), *sorted((root / "parsing").glob("*.py"))]
    return files + [root / f"{name}.py" for name in IMPORTED]


@functools.cache
def evaluator_version() -> str:
    """Hash of the evaluator's code: a change of rules (a new check, a tolerance) must
    never be answered by a verdict the old rules gave. Read once per process: the code
    this process runs, whatever is edited on disk meanwhile."""
    root = Path(__file__).parent.parent
    digest = hashlib.sha256()
    for path in evaluator_files():
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
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


def content(
    candidate: str,
    *,
    incumbent: str | None = None,
    run: int = 0,
    siblings: Mapping[str, str] | None = None,
    baseline: str = "eager",
) -> dict[str, Any]:
    """What one evaluation is of, as a structure (never a string joined from its parts:
    a sibling's text holding the separator would make two folders one content): the
    candidate, the incumbent it is timed against, which separate run, the files next to
    it that its box holds (by name), and the reference side's baseline."""
    return {
        "candidate": candidate,
        "incumbent": incumbent,
        "run": run,
        "siblings": dict(siblings or {}),
        "baseline": baseline,
    }


def key(
    task: Task,
    candidate: str | Mapping[str, Any],
    device: str,
    limits: Limits,
    *,
    sandbox: str = UNSANDBOXED,
) -> str:
    """The cache key: everything a verdict depends on, the sandbox mode included (a
    verdict measured without the sandbox never answers for one measured inside it), and
    the library policy (a verdict under one `--allow-torch` never answers for another).
    `candidate` is a `content` (a bare source: its plain evaluation). Injective: the
    digest of one structure, so no field's text can pass for another field's."""
    return digest(
        {
            "format": RECORD_FORMAT,
            "reference": task.reference_source,  # as run: a `--scale`d problem is another
            "allow_torch": sorted(allowed_ops(task.allow_torch)),
            "kind": task.kind,
            "entry": task.entry,
            "content": content(candidate) if isinstance(candidate, str) else candidate,
            "device": device,
            "limits": asdict(limits),
            "sandbox": sandbox,
            "fingerprint": fingerprint(),
        }
    )


def usable_as_baseline(verdict: Verdict) -> bool:
    """May other speedups be measured against `verdict` (the start, the best so far)?

    Only a correct, timed verdict with no error, no failed check and no suspect speedup;
    and a cached one only if it was measured inside the sandbox, where no candidate
    could have written the cache. Anything else is re-evaluated (`use_cache=False`)
    before it becomes a baseline, or never becomes one.
    """
    if not verdict.correct or verdict.error is not None or verdict.suspect:
        return False
    if verdict.shape_only:  # right at the task's shape only: never what others beat
        return False
    if any(not check.passed for check in verdict.checks):
        return False
    if not verdict.runtime_ms or verdict.runtime_ms <= 0 or not verdict.speedup:
        return False
    return not verdict.cached or verdict.sandbox != UNSANDBOXED


def _connect(path: Path) -> sqlite3.Connection:
    db = database.open_wal(path, BUSY_TIMEOUT_S)
    try:
        db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, record TEXT)")
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


@contextlib.contextmanager
def _open() -> Iterator[sqlite3.Connection]:
    """The cache database; a damaged one is moved aside and started afresh (it is only a
    cache: every verdict in it can be measured again). A busy one is waited for."""
    path = subdir("eval-cache") / DB_NAME
    try:
        db = _connect(path)
    except sqlite3.DatabaseError as error:
        if not database.damaged(error):
            raise
        path.replace(path.with_name(f"{DB_NAME}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"))
        db = _connect(path)
    try:
        with db:  # one transaction, committed on success
            yield db
    finally:
        db.close()


def _record(cache_key: str, verdict: Verdict, sandbox: str) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "key": cache_key,
        "evaluator": evaluator_version(),
        "sandbox": sandbox,
        "fingerprint": fingerprint(),
        "stored_at": time.time(),
        "verdict": verdict.to_json(),
    }


def _valid(record: Any, cache_key: str, sandbox: str) -> bool:
    """A record answers only for its own key, this evaluator and this sandbox mode."""
    return (
        isinstance(record, dict)
        and record.get("format") == RECORD_FORMAT
        and record.get("key") == cache_key
        and record.get("evaluator") == evaluator_version()
        and record.get("sandbox") == sandbox
        and isinstance(record.get("verdict"), dict)
        and record["verdict"].get("sandbox", sandbox) == sandbox
    )


def _decode(text: Any, cache_key: str, sandbox: str) -> Verdict | None:
    """The verdict of a stored row; a damaged or foreign row is a miss, never an answer."""
    try:
        record: Any = json.loads(text) if isinstance(text, str) else None
        if not _valid(record, cache_key, sandbox):
            return None
        return Verdict.from_json(record["verdict"])
    except (json.JSONDecodeError, TypeError, ValueError, KeyError):
        return None


def get(cache_key: str, *, sandbox: str = UNSANDBOXED, baseline: bool = False) -> Verdict | None:
    """The cached verdict for `cache_key` measured under `sandbox`, or None. With
    `baseline`, only a verdict `usable_as_baseline` (else None: evaluate it afresh)."""
    with _open() as db:
        row = db.execute("SELECT record FROM verdicts WHERE key = ?", (cache_key,)).fetchone()
    verdict = _decode(row[0] if row else None, cache_key, sandbox)
    if verdict is None:
        return None
    verdict.cached = True
    return verdict if not baseline or usable_as_baseline(verdict) else None


def put(cache_key: str, verdict: Verdict, *, sandbox: str) -> None:
    """Store `verdict` under `cache_key` as measured under `sandbox` (the mode its
    candidate actually ran in; a record whose verdict says otherwise is never answered)."""
    try:
        record = json.dumps(_record(cache_key, verdict, sandbox), allow_nan=False)
    except ValueError:
        return  # a NaN or an infinity in it: not worth keeping as a record
    with _open() as db:
        db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", (cache_key, record))
