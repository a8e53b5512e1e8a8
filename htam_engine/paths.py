"""Where HTAM keeps its files: `$HTAM_HOME`, else the user's data directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def home() -> Path:
    """The HTAM home directory (created on first use)."""
    override = os.environ.get("HTAM_HOME")
    if override:
        path = Path(override).expanduser()
    else:
        from platformdirs import user_data_dir

        path = Path(user_data_dir("htam", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def subdir(name: str) -> Path:
    """A named directory under the HTAM home (created on first use)."""
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_whole(path: Path, text: str) -> None:
    """Write `path` so that no reader, and no other process writing it, sees it half
    written (a private temporary file renamed over it)."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)


def held(descriptor: int) -> bool:
    """Does another open file hold a lock (`flock`) on `descriptor`'s file? The probe's
    own lock, if it took one, goes with `descriptor`, which it closes."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
