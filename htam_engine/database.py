"""SQLite as HTAM's stores open it: in WAL mode, and with a clear line between a file
that is damaged (its owner moves it aside and starts afresh) and one that is only busy.

Confirming WAL mode can answer "database is locked" at once, without waiting on the busy
timeout, while another process opens or closes the same file. Taken for damage, that
moved a live database aside and lost what other processes had just stored in it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

RETRY_S = 0.05


def open_wal(path: Path, timeout_s: float, **options: Any) -> sqlite3.Connection:
    """A connection in WAL mode; a busy or locked answer is retried until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        db = sqlite3.connect(path, timeout=timeout_s, **options)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return db
        except sqlite3.DatabaseError as error:
            db.close()
            if not _busy(error) or time.monotonic() >= deadline:
                raise
        time.sleep(RETRY_S)


def _busy(error: sqlite3.DatabaseError) -> bool:
    return _code(error) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def damaged(error: sqlite3.DatabaseError) -> bool:
    """Is the file at fault (corrupt, not a database), rather than a lock, a full disk or
    a permission? An error raised by HTAM's own checks carries no code: damage too."""
    code = _code(error)
    return code is None or code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _code(error: sqlite3.DatabaseError) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None  # the primary of an extended code
