"""A writer SIGKILLed at any point of a write leaves no phantom: what a rebuild from the
journal gives is what the database had committed (for outcomes and for `reset`)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from htam_engine.memory import MemoryStore
from htam_engine.memory.store import DB_NAME, JOURNAL_NAME

CHILD = r"""
import os, signal, sys
from pathlib import Path

import htam_engine.memory.store as store_module
from htam_engine.memory import START, MemoryStore, Outcome

point, operation, home = sys.argv[1], sys.argv[2], Path(sys.argv[3])
outcome = Outcome("cpu", "cpu:relu:f32", [START], [1.0], "thread_parallelism",
                  "omp_parallel_for", "improved", True, True, 1.5, 1.0, 0.4)
store = MemoryStore(home)
store.apply_outcome(outcome)
store.put("notes", "before", 1)


def die(*_args):
    os.kill(os.getpid(), signal.SIGKILL)


def then_die(original):
    def wrapper(*args, **kwargs):
        original(*args, **kwargs)
        die()
    return wrapper


if point == "in_transaction":  # the change is made, COMMIT not yet
    MemoryStore._apply = then_die(MemoryStore._apply)
    MemoryStore._clear = staticmethod(then_die(MemoryStore._clear))
elif point == "after_commit":  # committed, nothing journaled yet
    MemoryStore._flush_outbox = die
elif point == "after_journal_fsync":  # journaled and fsynced, outbox not cleared
    store_module.os.fsync = then_die(os.fsync)
if operation == "outcome":
    store.apply_outcome(outcome)
else:
    store.reset()
sys.exit(3)  # never reached: the hook killed the process
"""


def killed_writer(home: Path, point: str, operation: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, point, operation, str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def state(home: Path) -> tuple[Any, ...]:
    with MemoryStore(home) as store:
        graph = store.graph("cpu")
        return (
            graph.locals["omp_parallel_for"].stats.attempts,
            graph.globals["thread_parallelism"].stats.attempts,
            store.items("notes"),
        )


def corrupt(home: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{home / DB_NAME}{suffix}").unlink(missing_ok=True)
    (home / DB_NAME).write_bytes(b"this is not a database" * 100)


ONE: tuple[Any, ...] = (1, 1, [("before", 1)])
TWO: tuple[Any, ...] = (2, 2, [("before", 1)])
NONE: tuple[Any, ...] = (0, 0, [])


@pytest.mark.parametrize(
    ("point", "operation", "committed"),
    [
        ("in_transaction", "outcome", ONE),
        ("after_commit", "outcome", TWO),
        ("after_journal_fsync", "outcome", TWO),
        ("in_transaction", "reset", ONE),
        ("after_commit", "reset", NONE),
        ("after_journal_fsync", "reset", NONE),
    ],
)
def test_a_rebuild_after_a_killed_write_gives_what_was_committed(
    tmp_path: Path, point: str, operation: str, committed: tuple[Any, ...]
) -> None:
    killed_writer(tmp_path, point, operation)
    assert state(tmp_path) == committed  # the next open journals what was committed
    corrupt(tmp_path)
    assert state(tmp_path) == committed
    assert list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))


@pytest.mark.parametrize(
    ("point", "operation", "committed"),
    [
        ("in_transaction", "outcome", ONE),
        ("after_journal_fsync", "outcome", TWO),
        ("in_transaction", "reset", ONE),
    ],
)
def test_no_phantom_even_when_the_database_is_lost_right_after_the_kill(
    tmp_path: Path, point: str, operation: str, committed: tuple[Any, ...]
) -> None:
    killed_writer(tmp_path, point, operation)
    corrupt(tmp_path)  # no healthy open in between: the journal alone decides
    assert state(tmp_path) == committed


def test_a_committed_reset_leaves_an_empty_journal(tmp_path: Path) -> None:
    killed_writer(tmp_path, "after_commit", "reset")
    state(tmp_path)
    assert (tmp_path / JOURNAL_NAME).read_text() == ""
