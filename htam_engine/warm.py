"""`python -m htam_engine.warm TASK DEVICE`: an `htam optimize` started ahead.

The language server is long-lived, so it can start the next job's process before the
user asks (`htam_lsp.runs`): this process loads TASK (with its htam.toml policy), starts
the judge and workers that the first evaluation of TASK on DEVICE will take
(`standby`), imports the loop, and waits for one line on stdin: the job's `htam`
arguments as a JSON list, which it then runs as `htam` would. End of input (the server
went) ends it, and its spare with it; the spare holds no candidate until the job's.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from htam_engine import cli
from htam_engine.evaluate import runner, standby
from htam_engine.task import load_task, with_policy


def main(task_path: str, device: str) -> int:
    task = with_policy(load_task(Path(task_path)))
    standby.keep_warm(True)
    runner.start_ahead(task, device)
    importlib.import_module("htam_engine.loop")  # what the job imports first, done now
    line = sys.stdin.readline()
    if not line:
        return 0
    return cli.main([str(arg) for arg in json.loads(line)])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
