"""htam-lsp: the HTAM language server on stdio (pygls 2).

The server reads and explains; it never optimizes in its own process. Steps run as
`htam optimize --events` subprocesses (htam_lsp.jobs), and only when the client said
execution is allowed. Every handler is guarded: bad input is logged, never fatal.
"""

from __future__ import annotations

import gc

# Start-up: the imports below create ~100k long-lived objects, and the collector's passes
# over them while they load cost ~50 ms of a ~0.55 s start. Collection resumes at the end
# of this module, with everything loaded by then frozen out of full passes.
gc.disable()

import asyncio  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

from lsprotocol import types as t  # noqa: E402
from pygls.exceptions import (  # noqa: E402
    JsonRpcContentModified,
    JsonRpcException,
    JsonRpcInvalidParams,
)
from pygls.lsp.server import LanguageServer  # noqa: E402

from htam_engine import __version__, paths  # noqa: E402
from htam_lsp import actions, discovery, insight, render  # noqa: E402
from htam_lsp import suggestions as sg  # noqa: E402
from htam_lsp.documents import Document, DocumentStore, uri_path  # noqa: E402
from htam_lsp.jobs import TERMINAL, Job, kill_group, optimize_argv, run_process  # noqa: E402
from htam_lsp.positions import UTF16  # noqa: E402
from htam_lsp.protocol import HtamProtocol, Prerendered  # noqa: E402
from htam_lsp.settings import Settings  # noqa: E402

log = logging.getLogger("htam_lsp")
F = TypeVar("F", bound=Callable[..., Any])

JOB_STATE = "htam/jobState"
DIAGNOSTIC_DELAY_S = 0.15
PHASES = ("select", "generate", "compile", "verify", "time", "update")
NOT_ALLOWED = (
    "HTAM did not run anything: executing generated code is not allowed in this workspace. "
    "VS Code: trust the workspace (Workspaces: Manage Workspace Trust). Neovim: set "
    "init_options = { allowExecution = true } in vim.lsp.config('htam', ...)."
)


def guarded(default: Any = None) -> Callable[[F], F]:
    """Log any unexpected error of a handler and answer `default` instead of failing.

    JSON-RPC errors (a clear message for the client) pass through unchanged.
    """

    def wrap(fn: F) -> F:
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except JsonRpcException:
                    raise
                except Exception:
                    log.exception("%s failed", fn.__name__)
                    return default

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except JsonRpcException:
                raise
            except Exception:
                log.exception("%s failed", fn.__name__)
                return default

        return run  # type: ignore[return-value]

    return wrap


class HtamServer(LanguageServer):
    """The server's state: documents, settings, jobs, and the memory-backed records."""

    def __init__(self, home: Path | None = None) -> None:
        """`home`: the memory store's directory (None: the shared HTAM home)."""
        super().__init__(
            "htam-lsp",
            __version__,
            text_document_sync_kind=t.TextDocumentSyncKind.Incremental,
            protocol_cls=HtamProtocol,
        )
        self.docs = DocumentStore()
        self.settings = Settings()
        self.jobs: dict[str, Job] = {}
        self.records = sg.SuggestionStore(home)
        self.provider: dict[str, Any] | None = None  # the last worker's "start" event
        self.compile_errors: dict[str, tuple[str, int, str]] = {}  # uri -> (source, line, msg)
        self._graphs: dict[str, Any] = {}
        self._diagnostic_timers: dict[str, asyncio.TimerHandle] = {}

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log internal errors (e.g. pygls's own handling of a malformed change) instead of
        showing the user a pop-up for something they cannot act on."""
        log.error("internal error (%s): %s", getattr(source, "__name__", source), error)

    # --- positions -----------------------------------------------------------------------

    @property
    def encoding(self) -> str:
        try:
            encoding = self.workspace.position_encoding or UTF16
        except RuntimeError:
            return UTF16
        return str(getattr(encoding, "value", encoding))  # PositionEncodingKind is an enum

    def lsp_range(self, doc: Document, start: int, end: int) -> t.Range:
        (sl, sc), (el, ec) = (
            doc.index.position(start, self.encoding),
            doc.index.position(end, self.encoding),
        )
        return t.Range(t.Position(sl, sc), t.Position(el, ec))

    def offset(self, doc: Document, position: t.Position) -> int:
        return doc.index.offset(position.line, position.character, self.encoding)

    def document(self, uri: Any) -> Document:
        """The open document, or a clear JSON-RPC error for the client."""
        doc = self.docs.get(uri) if isinstance(uri, str) else None
        if doc is None:
            raise JsonRpcInvalidParams(f"HTAM: {uri!r} is not open in the editor")
        return doc

    # --- memory --------------------------------------------------------------------------

    def graph(self, backend: str) -> Any:
        """The learned HTG of a backend, cached until a step changes it."""
        if backend not in self._graphs:
            self._graphs[backend] = self.records.store.graph(backend)
        return self._graphs[backend]

    def forget_graphs(self) -> None:
        self._graphs.clear()

    # --- client capabilities -------------------------------------------------------------

    def caps(self, path: str, default: Any = None) -> Any:
        """A client capability by dotted attribute path, e.g. "window.work_done_progress"."""
        value: Any = getattr(self.protocol, "client_capabilities", None)
        for part in path.split("."):
            value = getattr(value, part, None)
            if value is None:
                return default
        return value

    def show(self, message: str, kind: t.MessageType = t.MessageType.Info) -> None:
        self.window_show_message(t.ShowMessageParams(type=kind, message=message))

    # --- jobs ----------------------------------------------------------------------------

    def publish_job(self, job: Job) -> None:
        self.protocol.notify(JOB_STATE, job.payload())

    def active_job(self, uri: str) -> Job | None:
        return next(
            (j for j in self.jobs.values() if j.uri == uri and j.state not in TERMINAL), None
        )

    def refresh_lenses(self) -> None:
        if self.caps("workspace.code_lens.refresh_support"):
            self.protocol.send_request(t.WORKSPACE_CODE_LENS_REFRESH, None)

    # --- diagnostics ---------------------------------------------------------------------

    def schedule_diagnostics(self, uri: str) -> None:
        timer = self._diagnostic_timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._diagnostic_timers[uri] = loop.call_later(
            DIAGNOSTIC_DELAY_S, self.publish_diagnostics, uri
        )

    @guarded()
    def publish_diagnostics(self, uri: str) -> None:
        self._diagnostic_timers.pop(uri, None)
        doc = self.docs.get(uri)
        if doc is None:
            return
        found = actions.diagnostics(self, doc)
        self.text_document_publish_diagnostics(
            t.PublishDiagnosticsParams(uri=uri, version=doc.version, diagnostics=found)
        )
        # The document has settled: its caches (trees, units, symbols) now live until the
        # next edit. Keep them out of full GC passes, which would scan them on every request;
        # they hold no reference cycles, so reference counting still frees them.
        gc.freeze()


server = HtamServer()


# --- lifecycle and settings -------------------------------------------------------------


@server.feature(t.INITIALIZE)
@guarded()
def initialize(ls: HtamServer, params: t.InitializeParams) -> None:
    ls.settings, problems = ls.settings.merged(params.initialization_options, may_allow=True)
    for problem in problems:
        log.warning("initializationOptions: %s", problem)


@server.feature(t.INITIALIZED)
@guarded()
async def initialized(ls: HtamServer, params: t.InitializedParams) -> None:
    # Everything imported so far lives as long as the server: keep it out of the garbage
    # collector's full passes, which otherwise show up as latency spikes.
    gc.freeze()
    await pull_configuration(ls)


@server.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
@guarded()
async def did_change_configuration(ls: HtamServer, params: t.DidChangeConfigurationParams) -> None:
    if isinstance(params.settings, dict) and isinstance(params.settings.get("htam"), dict):
        apply_settings(ls, params.settings["htam"])
    else:
        await pull_configuration(ls)


async def pull_configuration(ls: HtamServer) -> None:
    if not ls.caps("workspace.configuration"):
        return
    result = await ls.workspace_configuration_async(
        t.ConfigurationParams(items=[t.ConfigurationItem(section="htam")])
    )
    if result:
        apply_settings(ls, result[0])


def apply_settings(ls: HtamServer, raw: Any) -> None:
    """Workspace settings: they may switch execution off, never on (see settings.py)."""
    ls.settings, problems = ls.settings.merged(raw, may_allow=False)
    if problems:
        ls.show("HTAM settings ignored: " + "; ".join(problems), t.MessageType.Warning)


# --- documents --------------------------------------------------------------------------


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
@guarded()
def did_open(ls: HtamServer, params: t.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    ls.docs.open(item.uri, item.language_id, item.version, item.text)
    ls.schedule_diagnostics(item.uri)


@server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
@guarded()
def did_change(ls: HtamServer, params: t.DidChangeTextDocumentParams) -> None:
    doc = ls.docs.get(params.text_document.uri)
    if doc is None:
        log.warning("change for a document that is not open: %s", params.text_document.uri)
        return
    for change in params.content_changes:
        if isinstance(change, t.TextDocumentContentChangePartial):
            r = change.range
            doc.edit(
                (r.start.line, r.start.character),
                (r.end.line, r.end.character),
                change.text,
                ls.encoding,
            )
        else:
            doc.replace(change.text, params.text_document.version)
    doc.version = params.text_document.version
    ls.schedule_diagnostics(doc.uri)


@server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
@guarded()
def did_close(ls: HtamServer, params: t.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.docs.close(uri)
    timer = ls._diagnostic_timers.pop(uri, None)
    if timer is not None:
        timer.cancel()
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


# --- reading features -------------------------------------------------------------------


@server.feature(t.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
@guarded(default=[])
def document_symbol(ls: HtamServer, params: t.DocumentSymbolParams) -> Prerendered:
    """DocumentSymbol[] as pre-serialized JSON (see htam_lsp.protocol)."""
    doc = ls.docs.get(params.text_document.uri)
    return actions.symbols(ls, doc) if doc is not None else Prerendered([])


@server.feature(t.TEXT_DOCUMENT_CODE_LENS)
@guarded(default=[])
def code_lens(ls: HtamServer, params: t.CodeLensParams) -> list[t.CodeLens]:
    doc = ls.docs.get(params.text_document.uri)
    return actions.lenses(ls, doc) if doc is not None else []


@server.feature(t.TEXT_DOCUMENT_HOVER)
@guarded()
def hover(ls: HtamServer, params: t.HoverParams) -> t.Hover | None:
    doc = ls.docs.get(params.text_document.uri)
    if doc is None:
        return None
    unit = discovery.kernel_around(doc, ls.offset(doc, params.position))
    if unit is None:
        return None
    markdown = actions.explain(ls, doc, unit)
    return t.Hover(
        contents=t.MarkupContent(kind=t.MarkupKind.Markdown, value=markdown),
        range=ls.lsp_range(doc, unit.name_start, unit.name_end),
    )


@server.feature(
    t.TEXT_DOCUMENT_CODE_ACTION,
    t.CodeActionOptions(
        code_action_kinds=[t.CodeActionKind.QuickFix, actions.ACTION_KIND],
        resolve_provider=True,
    ),
)
@guarded(default=[])
def code_action(ls: HtamServer, params: t.CodeActionParams) -> list[t.CodeAction]:
    doc = ls.docs.get(params.text_document.uri)
    if doc is None:
        return []
    start = ls.offset(doc, params.range.start)
    found = actions.code_actions(ls, doc, start)
    only = params.context.only
    if only:
        found = [a for a in found if any(_kind_matches(a.kind, k) for k in only)]
    return found


def _kind_matches(kind: str | None, wanted: str) -> bool:
    return kind is not None and (kind == wanted or kind.startswith(f"{wanted}."))


@server.feature(t.CODE_ACTION_RESOLVE)
@guarded()
def code_action_resolve(ls: HtamServer, action: t.CodeAction) -> t.CodeAction:
    data = action.data if isinstance(action.data, dict) else {}
    doc = ls.document(data.get("uri"))
    if doc.version != data.get("version"):
        message = (
            f"HTAM: this suggestion was computed for version {data.get('version')} of the "
            f"document, which is now at version {doc.version}; ask for code actions again"
        )
        ls.show(message, t.MessageType.Warning)
        raise JsonRpcContentModified(message)
    action.edit = actions.suggestion_edit(ls, doc, data)
    return action


# --- commands ---------------------------------------------------------------------------


def _argument(args: tuple[Any, ...]) -> dict[str, Any]:
    if not args:
        return {}
    if not isinstance(args[0], dict):
        raise JsonRpcInvalidParams("HTAM commands take one object argument, e.g. {uri, position}")
    return args[0]


def _position(arg: dict[str, Any]) -> t.Position | None:
    pos = arg.get("position")
    if not isinstance(pos, dict):
        return None
    line, character = pos.get("line"), pos.get("character")
    if not isinstance(line, int) or not isinstance(character, int):
        raise JsonRpcInvalidParams("HTAM: position must be {line: int, character: int}")
    return t.Position(line, character)


@server.command("htam.nextStep")
@guarded()
async def next_step(ls: HtamServer, *args: Any) -> dict[str, Any]:
    return start_job(ls, _argument(args), 1)


@server.command("htam.optimize")
@guarded()
async def optimize(ls: HtamServer, *args: Any) -> dict[str, Any]:
    arg = _argument(args)
    steps = arg.get("steps", ls.settings.steps)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 100:
        raise JsonRpcInvalidParams("HTAM: steps must be an integer from 1 to 100")
    return start_job(ls, arg, steps)


@server.command("htam.cancel")
@guarded()
async def cancel(ls: HtamServer, *args: Any) -> dict[str, Any]:
    job_id = _argument(args).get("jobId")
    chosen = [j for j in ls.jobs.values() if j.state not in TERMINAL and job_id in (None, j.id)]
    for job in chosen:
        cancel_job(job)
    return {"cancelled": [j.id for j in chosen]}


@server.command("htam.explain")
@guarded()
async def explain(ls: HtamServer, *args: Any) -> dict[str, Any]:
    arg = _argument(args)
    doc = ls.document(arg.get("uri"))
    unit = _unit(ls, doc, _position(arg))
    return {"markdown": actions.explain(ls, doc, unit)}


@server.command("htam.showMemory")
@guarded()
async def show_memory(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """The memory of `backend`, else of the open document's backend (`uri`), else cuda."""
    arg = _argument(args)
    default = insight.backend(ls.document(arg["uri"])) if arg.get("uri") else "cuda"
    backend = arg.get("backend", default)
    if backend not in ("cuda", "cpu"):
        raise JsonRpcInvalidParams("HTAM: backend must be 'cuda' or 'cpu'")
    return actions.memory_summary(ls.graph(backend))


def _unit(ls: HtamServer, doc: Document, position: t.Position | None) -> discovery.Unit:
    offset = ls.offset(doc, position) if position is not None else 0
    unit = discovery.unit_at(doc, offset)
    if unit is None:
        raise JsonRpcInvalidParams(
            f"HTAM: no kernel at that position in {doc.uri} (put the cursor in a kernel)"
        )
    return unit


# --- jobs -------------------------------------------------------------------------------


def start_job(ls: HtamServer, arg: dict[str, Any], steps: int) -> dict[str, Any]:
    """Create the job and return its id at once; the work happens in a background task."""
    doc = ls.document(arg.get("uri"))
    unit = _unit(ls, doc, _position(arg))
    running = ls.active_job(doc.uri)
    if running is not None:
        return {"jobId": running.id, "state": running.state, "alreadyRunning": True}
    job = Job(doc.uri, unit.name, steps)
    ls.jobs[job.id] = job
    why_not = _refusal(ls, doc)
    if why_not:
        job.state, job.message = "refused", why_not
        ls.publish_job(job)
        ls.show(why_not, t.MessageType.Warning)
        return {"jobId": job.id, "state": job.state, "message": why_not}
    ls.publish_job(job)
    job.task = asyncio.create_task(run_job(ls, job, doc.data, uri_path(doc.uri) or ""))
    return {"jobId": job.id, "state": job.state}


def _refusal(ls: HtamServer, doc: Document) -> str | None:
    if not ls.settings.allow_execution:
        return NOT_ALLOWED
    if uri_path(doc.uri) is None:
        return f"HTAM runs on files on disk; {doc.uri} is not a file: URI"
    if insight.needs_binding(doc):
        return (
            "HTAM: this .cu file is not bound to a reference; apply the quick fix "
            "'bind to its reference' (or add an htam.toml [[kernel]] entry) first"
        )
    return None


def cancel_job(job: Job) -> None:
    job.cancel_requested = True
    kill_group(job)


async def run_job(ls: HtamServer, job: Job, data: bytes, task_path: str) -> None:
    """Run one `htam optimize` subprocess for `job`, reporting progress and state."""
    progress = await _begin_progress(ls, job)
    start_hash = sg.text_hash(data)
    buffer = paths.subdir("lsp-buffers") / f"{job.id}{Path(task_path).suffix}"
    try:
        buffer.write_bytes(data)
        record = ls.records.get(job.uri, job.kernel)
        argv = optimize_argv(
            task_path,
            str(buffer),
            job.steps,
            ls.settings,
            seed=len((record or {}).get("history", [])),
            output=str(paths.subdir("lsp-runs") / job.id),
        )
        job.state = "running"
        ls.publish_job(job)
        code, tail = (
            (-9, "")
            if job.cancel_requested
            else await run_process(
                job, argv, functools.partial(on_event, ls, start_hash=start_hash)
            )
        )
        _finish(job, code, tail)
    except Exception as error:  # the job fails; the server goes on
        log.exception("job %s failed", job.id)
        job.state, job.message = "failed", f"HTAM job failed: {error}"
    finally:
        buffer.unlink(missing_ok=True)
    if progress:
        ls.work_done_progress.end(job.token, t.WorkDoneProgressEnd(message=job.message))
    ls.publish_job(job)
    ls.refresh_lenses()
    ls.schedule_diagnostics(job.uri)


def _finish(job: Job, code: int, tail: str) -> None:
    if job.cancel_requested:
        job.state, job.message = "cancelled", "cancelled; the worker was stopped"
    elif code == 0:
        job.state = "done"
    else:
        job.state = "failed"
        last = tail.strip().splitlines()[-1] if tail.strip() else job.message or "no output"
        job.message = f"htam optimize failed (exit code {code}): {last}"


async def _begin_progress(ls: HtamServer, job: Job) -> bool:
    if not ls.caps("window.work_done_progress"):
        return False
    try:
        await asyncio.wait_for(ls.work_done_progress.create_async(job.token), 5)
    except Exception:
        log.warning("the client did not create progress %s", job.token)
        return False
    ls.work_done_progress.begin(
        job.token,
        t.WorkDoneProgressBegin(
            title=f"HTAM: {job.kernel}", cancellable=True, message="starting", percentage=0
        ),
    )
    return True


@guarded()
def on_event(ls: HtamServer, job: Job, event: dict[str, Any], *, start_hash: str) -> None:
    """One JSON-line event of the worker: update the job, the records and the client."""
    kind = event.get("event")
    if kind == "start":
        ls.provider = event
        job.message = f"provider: {event.get('provider_reason', event.get('provider'))}"
    elif kind == "phase":
        _on_phase(ls, job, event)
    elif kind == "step":
        _on_step(ls, job, event, start_hash)
    elif kind == "result":
        job.best_speedup = event.get("best_speedup")
        job.message = (
            f"best {render.speedup(event.get('best_speedup'))} over the start, "
            f"{render.speedup(event.get('ref_speedup'))} vs PyTorch"
        )
    ls.publish_job(job)


def _on_phase(ls: HtamServer, job: Job, event: dict[str, Any]) -> None:
    job.step, job.phase = int(event.get("step") or 0), str(event.get("phase", ""))
    move = f"{event.get('global', '')} -> {event.get('local', '')}".strip(" ->")
    where = f"step {job.step}/{job.steps}" if job.step else "measuring the starting code"
    job.message = f"{where}: {job.phase} {move}".strip()
    if job.token in ls.work_done_progress.tokens:
        done = PHASES.index(job.phase) if job.phase in PHASES else 0
        percentage = int(100 * (max(job.step - 1, 0) + done / len(PHASES)) / job.steps)
        ls.work_done_progress.report(
            job.token, t.WorkDoneProgressReport(message=job.message, percentage=percentage)
        )


def _on_step(ls: HtamServer, job: Job, event: dict[str, Any], start_hash: str) -> None:
    record = ls.records.get(job.uri, job.kernel)
    number = len((record or {}).get("history", [])) + 1
    ls.records.put(
        job.uri, job.kernel, sg.add_step(record, sg.trim_step(event, start_hash, number))
    )
    verdict = event.get("verdict") or {}
    error = verdict.get("error") or {}
    if not verdict.get("compiled") and error.get("line"):
        ls.compile_errors[job.uri] = (
            str(event.get("source", "")),
            int(error["line"]),
            str(error.get("message", "")),
        )
    elif verdict.get("compiled"):
        ls.compile_errors.pop(job.uri, None)
    gain = event.get("speedup")
    if verdict.get("correct") and gain is not None:
        job.best_speedup = max(gain, job.best_speedup or 0.0)
    ls.forget_graphs()
    ls.refresh_lenses()
    ls.schedule_diagnostics(job.uri)


@server.feature(t.WINDOW_WORK_DONE_PROGRESS_CANCEL)
@guarded()
def progress_cancel(ls: HtamServer, params: t.WorkDoneProgressCancelParams) -> None:
    for job in ls.jobs.values():
        if job.token == params.token and job.state not in TERMINAL:
            cancel_job(job)


@server.feature(t.SHUTDOWN)
@guarded()
def shutdown(ls: HtamServer, params: Any) -> None:
    for job in ls.jobs.values():
        if job.state not in TERMINAL:
            cancel_job(job)


gc.freeze()
gc.enable()


def main() -> None:
    """The `htam-lsp` console script: serve LSP on stdin/stdout, log to stderr."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="htam-lsp %(levelname)s %(message)s"
    )
    logging.getLogger("pygls").setLevel(logging.WARNING)  # it logs every message at INFO
    server.start_io()


if __name__ == "__main__":
    main()
