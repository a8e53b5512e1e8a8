"""A job as the editor sees it: why not, the unsaved buffer, progress, and each typed
event of `htam optimize --events` turned into records, diagnostics and a last message.

`Runs` is the server's feature object for jobs: it owns the job manager, the worker's
last word (its provider) and the compile errors the last candidates left; the process
itself and its cancellation belong to `htam_lsp.jobs.JobManager`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types as t
from pygls.capabilities import get_capability

from htam_engine import events, machine, paths
from htam_engine.formatting import format_speedup
from htam_engine.vocabulary import NOTHING_APPLIES, ErrorKind, JobState
from htam_lsp import discovery, insight, render, status
from htam_lsp import suggestions as sg
from htam_lsp.diagnostics import CompileError, compiler_words
from htam_lsp.documents import Document, uri_path
from htam_lsp.jobs import Job, JobManager, eval_argv, optimize_argv, printed_verdict
from htam_lsp.llm_provider import provider

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

log = logging.getLogger(__name__)

PHASES = tuple(render.PHASE_WORDS)  # a step's phases, in order
_YOURS = "your kernel does not compile:"
CHECKING = "compile check: nvcc is building the file (nothing runs; no GPU here)"
_CHANGED = "your code changed while it ran, so it no longer applies: run a step again"


@dataclass(frozen=True)
class Start:
    """The buffer a job starts from, and where its kernels were (character offsets)."""

    text: str
    kernels: list[tuple[int, int]]

    @property
    def hash(self) -> str:
        return sg.text_hash(self.text)


class Runs:
    """Jobs of the server: started, refused, followed event by event, summarised."""

    def __init__(self, ls: HtamServer) -> None:
        self.ls = ls
        self.jobs = JobManager()
        self.provider: events.Start | None = None  # the last worker's own word
        self.closing = False  # shutting down: a running job is cut short, not ended
        self.compile_errors: dict[str, CompileError] = {}  # uri -> where its code failed
        self._pending: set[asyncio.Task[None]] = set()

    def start(self, doc: Document, unit: discovery.Unit, steps: int) -> dict[str, Any]:
        """Create the job and return its id at once; the work happens in a background task.
        It optimizes the whole file, so it is named by the file's task wherever `unit` is."""
        unit = discovery.task_unit(doc) or unit
        running = self.jobs.active(doc.uri)
        if running is not None:
            return {"jobId": running.id, "state": running.state, "alreadyRunning": True}
        job = self.jobs.create(doc.uri, job_name(doc), steps, unit.name)
        why_not = self.refusal(doc, unit)
        if why_not:
            job.state, job.message = "refused", why_not
            self.ls.publish_job(job)
            return {"jobId": job.id, "state": job.state, "message": why_not}
        unparsed = _syntax_error(doc)
        if unparsed is not None:  # nothing can run it: said on its line, before any step
            self.compile_errors[doc.uri] = unparsed
            self.ls.schedule_diagnostics(doc.uri)
            said = compiler_words(unparsed.message)
            job.state, job.message = "refused", f"{_YOURS} {said} (line {unparsed.line})"
            self.ls.publish_job(job)
            return {"jobId": job.id, "state": job.state, "message": job.message}
        begun = Start(doc.text, _kernel_ranges(doc))
        job.excluded = tuple(sg.spent_strategies(self.ls.records.history(doc.uri), begun.text))
        self.ls.publish_job(job)
        job.task = asyncio.create_task(self.run(job, doc.data, begun, uri_path(doc.uri) or ""))
        return {"jobId": job.id, "state": job.state}

    def warm_up(self, doc: Document) -> None:
        """Have the next job's process, judge and workers started for `doc` before the
        user asks, when it is a kernel bound to its reference that a job could run on now
        (`JobManager.warm_up`), unless the `startAhead` setting is off."""
        unit = discovery.task_unit(doc)
        path = uri_path(doc.uri)
        if unit is None or path is None or not insight.binding(doc).get("reference"):
            return
        if self.ls.settings.start_ahead and self.refusal(doc, unit) is None:
            self._background(self.jobs.warm_up(path, self.ls.settings.device))

    def cool(self, doc_uri: str | None = None) -> None:
        """End the process started ahead (only the one for `doc_uri`, when given)."""
        path = uri_path(doc_uri) if doc_uri is not None else None
        if doc_uri is None or path is not None:
            self._background(self.jobs.cool(path))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)  # a reference: the loop holds tasks only weakly
        task.add_done_callback(self._pending.discard)

    def refusal(self, doc: Document, unit: discovery.Unit) -> str | None:
        """Why a job on `unit` cannot run here, said before anything starts; else None."""
        if not self.ls.settings.allow_execution:
            return (
                "nothing was run: executing generated code is not allowed in this workspace; "
                f"to allow it: {status.how_to_allow(self.ls)}"
            )
        if uri_path(doc.uri) is None:
            return "HTAM runs on files saved on disk; save this buffer as a file first"
        if insight.needs_binding(doc):
            return (
                f"{Path(uri_path(doc.uri) or doc.uri).name} is not bound to its PyTorch "
                "reference; bind it first (the lens or quick fix 'bind to its reference', or "
                "an htam.toml [[kernel]] entry)"
            )
        if insight.backend(doc) == "cuda" and (
            self.ls.settings.device == "cpu" or not machine.gpu_present()
        ):
            where = (
                "the device setting is cpu"
                if self.ls.settings.device == "cpu"
                else "there is none here (the NVIDIA driver lists no GPU)"
            )
            return (
                f"{job_name(doc)} was not started: a CUDA kernel needs an NVIDIA GPU to be "
                f"verified and timed, and {where}. The code action 'compile-check with nvcc' "
                f"({status.how_to_check(self.ls)}) checks that it builds."
            )
        return None

    def start_check(self, doc: Document, unit: discovery.Unit) -> dict[str, Any]:
        """A compile check of a CUDA kernel with nvcc (`htam eval` where no GPU runs it): of
        the whole file, so named by its task wherever `unit` is."""
        unit = discovery.task_unit(doc) or unit
        job = self.jobs.create(doc.uri, job_name(doc), 0, unit.name)
        why_not = self.check_refusal(doc)
        if why_not:
            job.state, job.message = "refused", why_not
            self.ls.publish_job(job)
            return {"jobId": job.id, "state": job.state, "message": why_not}
        job.state, job.message = "running", CHECKING  # what it does, not "queued"
        self.ls.publish_job(job)
        self.ls.refresh_lenses()  # the kernel's lens shows the check running
        job.task = asyncio.create_task(self.check(job, doc.data, uri_path(doc.uri) or ""))
        return {"jobId": job.id, "state": job.state}

    def check_refusal(self, doc: Document) -> str | None:
        if not self.ls.settings.allow_execution:
            how = status.how_to_allow(self.ls)
            return f"nothing is compiled here until allowed; to allow it: {how}"
        if uri_path(doc.uri) is None or insight.needs_binding(doc):
            return "a compile check needs a file on disk bound to its reference"
        if insight.backend(doc) != "cuda" or shutil.which("nvcc") is None:
            return "a compile check is for CUDA kernels, with nvcc on the server's PATH"
        return None

    async def check(self, job: Job, data: bytes, task_path: str) -> None:
        """Run the compile check and say how it went (a compile error also as a diagnostic)."""
        buffer = paths.subdir("lsp-buffers") / f"{job.id}{Path(task_path).suffix}"
        try:
            buffer.write_bytes(data)
            self.ls.publish_job(job)
            code, out, tail = await self.jobs.output(job, eval_argv(task_path, str(buffer), "cuda"))
            job.state, job.message = _checked(self, job, code, out, tail, data)
        except Exception as error:  # the check fails; the server goes on
            log.exception("check %s failed", job.id)
            job.state, job.message = "failed", f"the compile check failed: {error}"
        finally:
            buffer.unlink(missing_ok=True)
        self.ls.publish_job(job)
        self.ls.refresh_lenses()  # the "running (cancel)" lens is over
        self.ls.schedule_diagnostics(job.uri)

    async def run(self, job: Job, data: bytes, begun: Start, task_path: str) -> None:
        """Run one `htam optimize` subprocess for `job`, reporting progress and state."""
        progress = await self._begin_progress(job)
        buffer = paths.subdir("lsp-buffers") / f"{job.id}{Path(task_path).suffix}"
        try:
            buffer.write_bytes(data)  # the unsaved buffer is what the job optimizes
            argv = optimize_argv(
                task_path,
                str(buffer),
                job.steps,
                self.ls.settings,
                seed=len(self.ls.records.history(job.uri)),
                output=str(paths.subdir("lsp-runs") / job.id),
                exclude=job.excluded,
            )
            job.state = "running"
            self.ls.records.mark_running(job.uri, job.payload())
            self.ls.publish_job(job)
            self.ls.refresh_lenses()  # the kernel's lens shows the job running
            on_event = functools.partial(self.on_event, begun=begun)
            await self.jobs.run(job, argv, on_event, task_path, self.ls.settings.device)
            self._start_compiled(job, begun)
            if job.state == "done":
                job.message = self.summary(job, begun)
            elif job.state == "failed" and job.steps_done == 0 and job.excluded:
                job.state, job.message = self._spent(job)
        except Exception as error:  # the job fails; the server goes on
            log.exception("job %s failed", job.id)
            job.state, job.message = "failed", f"the job failed: {error}"
        finally:
            buffer.unlink(missing_ok=True)
        if self.closing:  # the next server says it was interrupted (`interrupted`)
            return
        self.ls.records.mark_running(job.uri, None)
        if progress:
            self.ls.work_done_progress.end(job.token, t.WorkDoneProgressEnd(message=job.message))
        self.ls.publish_job(job)
        self.ls.refresh_lenses()
        self.ls.schedule_diagnostics(job.uri)
        if (doc := self.ls.docs.get(job.uri)) is not None:
            self.warm_up(doc)  # ready for the next step

    def interrupted(self, uri: str) -> None:
        """Say that a job on `uri` was cut short by a restart of the server (kept as
        running by the server before this one), once."""
        kept = self.ls.records.running(uri)
        if kept is None or self.jobs.active(uri) is not None:
            return
        self.ls.records.mark_running(uri, None)
        job = self.jobs.create(uri, str(kept.get("kernel") or ""), int(kept.get("steps") or 0))
        job.state = "failed"
        job.message = (
            "interrupted: the HTAM server restarted while this job ran; the steps it "
            "finished are kept: run it again for the rest"
        )
        self.ls.publish_job(job)

    def _spent(self, job: Job) -> tuple[JobState, str]:
        """A job that ran no step where strategies were excluded (they did not help on this
        code before): used up, with how to let a model try; else its failure, noted."""
        tried = ", ".join(job.excluded)
        stopped = job.last.stopped if isinstance(job.last, events.Result) else ""
        if stopped != NOTHING_APPLIES:
            return (
                "failed",
                f"{job.message}; not retried, as they did not help on this code: {tried}",
            )
        chosen, _why = provider(self.ls)
        if chosen == "offline":
            how = status.how_to_let_a_model_try(self.ls)
            return "done", (
                f"the mechanical strategies are used up on this code (tried without helping: "
                f"{tried}). To let a model try: {how}. Or edit the kernel and step again"
            )
        return "done", (
            f"every strategy that applies was tried on this code without helping ({tried}); "
            "edit the kernel to try again"
        )

    def _start_compiled(self, job: Job, begun: Start) -> None:
        """Where the code the job started from (the user's) did not compile, that is the
        job's word, on its line: no candidate of a step is to blame."""
        ended = job.last if isinstance(job.last, events.Result) else None
        error = ended.start_error if ended is not None else None
        if error is None or error.kind != ErrorKind.COMPILE_ERROR:
            kept = self.compile_errors.get(job.uri)
            if ended is not None and kept is not None and kept.origin == "start":
                del self.compile_errors[job.uri]  # it compiles now
            return
        said = compiler_words(error.message)
        job.state, job.message = "failed", _YOURS + f" {said}"
        if error.line is not None:
            job.message += f" (line {error.line})"
            self.compile_errors[job.uri] = CompileError(
                begun.text, error.line, error.message, "start"
            )

    def summary(self, job: Job, begun: Start) -> str:
        """The last word of a finished job: what it found for the code it started from, with
        numbers, whatever became of the buffer meanwhile (closed, edited)."""
        history = self.ls.records.history(job.uri)
        threshold = self.ls.settings.min_speedup
        found = sg.offer(history, begun.text, threshold)
        doc = self.ls.docs.get(job.uri)
        edited = doc is not None and doc.text != begun.text
        now = sg.offer(history, doc.text, threshold) if edited and doc else found
        job.suggestions = len(now.suggestions)
        job.best_speedup = now.suggestions[0].record.speedup if now.suggestions else None
        stopped = "" if not isinstance(job.last, events.Result) else job.last.stopped
        tail = "" if stopped in ("", "completed") else f" (stopped: {stopped})"
        if found.suggestions:
            best = found.suggestions[0].record
            where = "apply it from the code actions" if now.suggestions else _CHANGED
            return f"best {render.gain_text(best)}; {where}{tail}"
        if found.untimed and not found.slower:
            note = found.untimed[-1].step.verdict.note or "not timed here"
            return f"nothing to apply: correct, but {note}: no speedup to compare{tail}"
        closest = render.best_slower(found.slower)
        if closest is not None:
            return (
                f"nothing to apply: no candidate was surely {format_speedup(threshold)} faster "
                f"than your code ({render.below_text(closest, threshold)}){tail}"
            )
        ran = history[-job.steps_done :] if job.steps_done else []
        why = "; ".join(f"step {r.step.step} {render.outcome(r.step)}" for r in ran)
        return f"nothing to apply: no correct candidate ({why or 'no step finished'}){tail}"

    async def _begin_progress(self, job: Job) -> bool:
        if not get_capability(self.ls.client_capabilities, "window.work_done_progress"):
            return False
        try:
            await asyncio.wait_for(self.ls.work_done_progress.create_async(job.token), 5)
        except Exception:
            log.warning("the client did not create progress %s", job.token)
            return False
        self.ls.work_done_progress.begin(
            job.token,
            t.WorkDoneProgressBegin(
                title=f"HTAM: {job.kernel}",
                cancellable=True,
                message=self._first(job),
                percentage=0,
            ),
        )
        return True

    def _first(self, job: Job) -> str:
        """The first word, sent at once: the phase and, from this kernel's recorded step
        times, the time left (the start and each step at the median recorded step)."""
        recorded = [sum(r.step.phases.values()) for r in self.ls.records.history(job.uri)]
        left = events.PhaseClock([s for s in recorded if s > 0]).left_s(job.steps + 1)
        return "measuring the starting code" + _left_text(left)

    def on_event(self, job: Job, event: events.Event, *, begun: Start) -> None:
        """One event of the worker: update the job, the records and the client."""
        try:
            if isinstance(event, events.Start):
                self.provider = event
            elif isinstance(event, events.Phase):
                self._on_phase(job, event)
            elif isinstance(event, events.Step):
                self._on_step(job, event, begun)
            elif isinstance(event, events.Result):
                job.ref_speedup = event.ref_speedup
                self._on_result(job, event)
        except Exception:  # a bad event must not end the job's reading
            log.exception("job %s: could not handle a %s event", job.id, event.kind)
        if not isinstance(event, events.Result | events.Failed):
            self.ls.publish_job(job)  # the final state follows when the process has ended

    def _on_phase(self, job: Job, event: events.Phase) -> None:
        job.step, job.phase = event.step, event.phase
        move = f"{event.global_id} -> {event.local_id}".strip(" ->")
        where = f"step {job.step}/{job.steps}" if job.step else "measuring the starting code"
        job.message = f"{where}: {job.phase} {move}".strip() + _left_text(event.left_s)
        self.ls.refresh_lenses()  # the running lens says the phase too
        if job.token in self.ls.work_done_progress.tokens:
            done = PHASES.index(job.phase) if job.phase in PHASES else 0
            percentage = int(100 * (max(job.step - 1, 0) + done / len(PHASES)) / job.steps)
            self.ls.work_done_progress.report(
                job.token, t.WorkDoneProgressReport(message=job.message, percentage=percentage)
            )

    def _on_result(self, job: Job, result: events.Result) -> None:
        """The run's last word: its best step, re-timed in pairs against the start."""
        mine = [r for r in self.ls.records.history(job.uri) if r.n in job.records.values()]
        claims = sg.run_claims(result, mine)
        if claims:
            self.ls.records.confirm(job.uri, claims)
            self.ls.refresh_lenses()

    def _on_step(self, job: Job, step: events.Step, begun: Start) -> None:
        """Record the step with the claim of its duel, against the record of the step the
        engine timed it against (`Duel.against`; 0: the code the job started from)."""
        anchor = sg.anchor(begun.text, step.source, begun.kernels) if step.correct else None
        against = step.versus_best.against if step.versus_best else 0
        versus = job.records.get(against, 0)
        self.ls.records.add(job.uri, step, anchor, begun.hash, versus=versus)
        job.records[step.step] = self.ls.records.history(job.uri)[-1].n
        error = step.error
        if not step.compiled and error is not None and error.line is not None:
            self.compile_errors[job.uri] = CompileError(
                step.source, error.line, error.message, "candidate"
            )
        elif step.compiled:
            self.compile_errors.pop(job.uri, None)
        self.ls.forget_graphs()
        self.ls.refresh_lenses()
        self.ls.schedule_diagnostics(job.uri)


def _checked(
    runs: Runs, job: Job, code: int, out: bytes, tail: str, data: bytes
) -> tuple[JobState, str]:
    if job.cancel_requested:
        return "cancelled", "the compile check was stopped"
    verdict = printed_verdict(out)
    if verdict is None:
        lines = tail.strip().splitlines()
        return (
            "failed",
            f"htam eval gave no verdict (exit code {code}): {lines[-1] if lines else ''}",
        )
    error = verdict.error
    if verdict.compiled:
        runs.compile_errors.pop(job.uri, None)
        return "done", f"it compiles: {(error.message if error else '') or 'no error'}"
    if error is None or error.kind != "compile_error":
        lines = (error.message if error else "").strip().splitlines() or ["no verdict"]
        return "failed", f"{error.kind if error else 'failed'}: {lines[0]}"
    said, name = compiler_words(error.message), Path(uri_path(job.uri) or job.uri).name
    if error.line is None:
        return "failed", f"{name} does not compile with nvcc: {said}"
    source = data.decode("utf-8", "replace")
    runs.compile_errors[job.uri] = CompileError(source, error.line, error.message, "check")
    return "failed", f"{name} line {error.line} does not compile with nvcc: {said}"


def job_name(doc: Document) -> str:
    """A job by the name the user gave: the file's one kernel function, else the file
    (never the task's class, e.g. KernelBench's `ModelNew`, which every file has)."""
    own = [u.name for u in discovery.units(doc) if u.is_kernel and u.kind != "model"]
    names = list(dict.fromkeys(own))
    return names[0] if len(names) == 1 else Path(uri_path(doc.uri) or doc.uri).name


def _syntax_error(doc: Document) -> CompileError | None:
    """A Python kernel that does not parse, at its line in the user's words (compiled
    here, never run: no evaluator and no sandbox path in between)."""
    if doc.language != "python":
        return None
    try:
        compile(doc.text, Path(uri_path(doc.uri) or doc.uri).name, "exec", dont_inherit=True)
    except SyntaxError as error:
        return CompileError(doc.text, error.lineno or 1, f"SyntaxError: {error.msg}", "start")
    except ValueError as error:  # null bytes
        return CompileError(doc.text, 1, str(error), "start")
    return None


def _left_text(left_s: float | None) -> str:
    """ " (about 36 s left)"; past the engine's estimate (it says 0 s), never a frozen
    "0 s left" but that it takes longer than expected."""
    if left_s is None:
        return ""
    return f" (about {left_s:.0f} s left)" if left_s >= 1 else " (taking longer than expected)"


def _kernel_ranges(doc: Document) -> list[tuple[int, int]]:
    """The document's kernel units as character ranges of `doc.text`."""
    data = doc.data

    def chars(offset: int) -> int:
        return len(data[:offset].decode("utf-8", "replace"))

    return [(chars(u.start_byte), chars(u.end_byte)) for u in discovery.units(doc)]
