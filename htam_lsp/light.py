"""The current code's speed of light, for the hover before any step.

Hovering a kernel that a step could run on measures the code as it is now, once per text
(`htam eval TASK BUFFER --json`: the same judge, sandbox and verdict cache a step's
"measuring the starting code" uses), and the hover then says where it stands: its time,
the floor this machine allows it (the roofline time), the bandwidth or FLOP/s it reaches
as a share of this core's (or GPU's), and PyTorch's time. Nothing runs while a job runs
(it would disturb the job's timings), or where a step would be refused.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from htam_engine import paths
from htam_engine.evaluate.verdict import Verdict
from htam_engine.placement import Placement
from htam_engine.roofline import describe
from htam_lsp import discovery
from htam_lsp import suggestions as sg
from htam_lsp.documents import Document, uri_path
from htam_lsp.jobs import Job, eval_argv, kill_group, printed_verdict, run_process

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

log = logging.getLogger(__name__)

MEASURING = "measuring your code and PyTorch's on this machine now: hover again in a few seconds"


@dataclass
class Measured:
    """One text's measurement: running (no verdict yet), its verdict, or why it failed."""

    text_hash: str
    verdict: Verdict | None = None
    failed: str = ""
    job: Job | None = None  # the `htam eval` process while it runs


class Light:
    """Per document: the last measurement of its current code."""

    def __init__(self, ls: HtamServer) -> None:
        self.ls = ls
        self.measured: dict[str, Measured] = {}  # uri -> the latest text's measurement
        self._tasks: set[asyncio.Task[None]] = set()

    def line(self, doc: Document) -> str:
        """The hover's speed-of-light line for `doc`'s text now ("" where nothing can be
        measured here), starting the measurement on the first ask."""
        found = self.measured.get(doc.uri)
        if found is None or found.text_hash != sg.text_hash(doc.text):
            if not self._start(doc):
                return ""
            return f"**Speed of light**: {MEASURING}"
        return f"**Speed of light**: {_said(found)}"

    def _start(self, doc: Document) -> bool:
        """Measure `doc`'s text in the background; False where a step could not run on it
        or a job runs now."""
        unit = discovery.task_unit(doc)
        path = uri_path(doc.uri)
        if unit is None or path is None or self.ls.runs.refusal(doc, unit) is not None:
            return False
        if self.ls.runs.jobs.running():
            return False
        found = Measured(sg.text_hash(doc.text), job=Job(doc.uri, unit.name, 0))
        self.measured[doc.uri] = found
        task = asyncio.get_running_loop().create_task(self._measure(found, doc.data, path))
        self._tasks.add(task)  # a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)
        return True

    async def _measure(self, found: Measured, data: bytes, task_path: str) -> None:
        assert found.job is not None
        buffer = paths.subdir("lsp-buffers") / f"{found.job.id}-light{Path(task_path).suffix}"
        chunks: list[bytes] = []
        try:
            buffer.write_bytes(data)
            argv = eval_argv(task_path, str(buffer), self.ls.settings.device)
            code, tail = await run_process(found.job, argv, lambda _job, raw: chunks.append(raw))
            found.verdict = printed_verdict(b"".join(chunks))
            if found.verdict is None:
                lines = tail.strip().splitlines() or [f"exit code {code}"]
                found.failed = f"htam eval gave no verdict: {lines[-1]}"
        except Exception as error:  # the hover says so; the server goes on
            log.exception("measuring %s failed", task_path)
            found.failed = f"the measurement failed: {error}"
        finally:
            buffer.unlink(missing_ok=True)
            found.job = None

    def stop(self) -> None:
        """Kill every measurement still running (the server shuts down)."""
        for found in self.measured.values():
            if found.job is not None:
                kill_group(found.job)


def _said(found: Measured) -> str:
    """What the measurement says, in one line."""
    verdict = found.verdict
    if verdict is None:
        return found.failed or MEASURING
    if not verdict.correct:
        error = verdict.error
        first = (error.message if error else "").strip().splitlines() or ["no detail"]
        return f"your code could not be timed ({error.kind if error else 'failed'}: {first[0]})"
    if verdict.runtime_ms is None:
        return f"your code is correct, but {verdict.note or 'it was not timed here'}"
    return speed_of_light(verdict)


def speed_of_light(verdict: Verdict) -> str:
    """ "your code 27.4 ms; its floor here 1.21 ms: at 4 % of this core's memory bandwidth
    (1.22 of 27.7 GB/s); PyTorch 6.51 ms (at 19 %)" for a timed verdict."""
    said = f"your code {_ms(verdict.runtime_ms)}"
    light = verdict.roofline
    if isinstance(light, Placement):
        fastest = light.roofline_ms + (light.harness_ms or 0.0)  # the harness's share in
        said += f"; its floor here {_ms(fastest)}: {describe(light)}"
    elif light is not None:
        said += f"; no floor ({light.why})"
    if verdict.ref_runtime_ms:
        share = light.reference_fraction if isinstance(light, Placement) else None
        said += f"; PyTorch {_ms(verdict.ref_runtime_ms)}"
        said += f" (at {100 * share:.0f} %)" if share is not None else ""
    return said


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g} ms"


def with_line(markdown: str, line: str) -> str:
    """The hover's markdown with `line` under its heading (unchanged without a line)."""
    if not line:
        return markdown
    heading, _, rest = markdown.partition("\n\n")
    return f"{heading}\n\n{line}\n\n{rest}"
