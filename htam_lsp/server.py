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
from typing import TYPE_CHECKING, Any, TypeVar  # noqa: E402

from lsprotocol import types as t  # noqa: E402
from pygls.capabilities import get_capability  # noqa: E402
from pygls.exceptions import (  # noqa: E402
    JsonRpcContentModified,
    JsonRpcException,
    JsonRpcInvalidParams,
)
from pygls.lsp.server import LanguageServer  # noqa: E402

from htam_engine import __version__  # noqa: E402
from htam_engine.vocabulary import BACKENDS, MAX_STEPS, MIN_STEPS  # noqa: E402
from htam_lsp import (  # noqa: E402
    code_actions,
    diagnostics,
    discovery,
    insight,
    lenses,
    light,
    memory_view,
    rationale,
    results_view,
    status,
    symbols,
)
from htam_lsp import suggestions as sg  # noqa: E402
from htam_lsp.documents import Document, DocumentStore  # noqa: E402
from htam_lsp.jobs import Job  # noqa: E402
from htam_lsp.positions import UTF16  # noqa: E402
from htam_lsp.protocol import HtamProtocol, Prerendered  # noqa: E402
from htam_lsp.runs import Runs  # noqa: E402
from htam_lsp.settings import Settings  # noqa: E402

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph

log = logging.getLogger("htam_lsp")
F = TypeVar("F", bound=Callable[..., Any])

JOB_STATE = "htam/jobState"
DIAGNOSTIC_DELAY_S = 0.15


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
        self.records = sg.SuggestionStore(home)
        self.runs = Runs(self)  # jobs: their manager, events, and the errors they left
        self.light = light.Light(self)  # the current code's speed of light, for the hover
        self.problems: dict[str, list[str]] = {}  # ignored settings, by where they came from
        self.client_name = ""  # clientInfo.name: advice in the client's own terms
        self.focus = ""  # the document the user worked in last (for commands without one)
        self._graphs: dict[str, Graph] = {}
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

    def graph(self, backend: str) -> Graph:
        """The learned HTG of a backend, cached until a step changes it."""
        if backend not in self._graphs:
            self._graphs[backend] = self.records.store.graph(backend)
        return self._graphs[backend]

    def forget_graphs(self) -> None:
        self._graphs.clear()

    # --- client capabilities -------------------------------------------------------------

    @property
    def client_capabilities(self) -> t.ClientCapabilities:
        """What the client said it supports (nothing before `initialize`); read a part with
        pygls's `get_capability(ls.client_capabilities, "window.work_done_progress")`."""
        said: t.ClientCapabilities | None = getattr(self.protocol, "client_capabilities", None)
        return said if said is not None else t.ClientCapabilities()

    def show(self, message: str, kind: t.MessageType = t.MessageType.Info) -> None:
        self.window_show_message(t.ShowMessageParams(type=kind, message=message))

    # --- jobs ----------------------------------------------------------------------------

    def publish_job(self, job: Job) -> None:
        """The job's state to the client, which shows it (a refusal or failure with the
        server's or the engine's own reason in `message`)."""
        self.protocol.notify(JOB_STATE, job.payload())

    def refresh_lenses(self) -> None:
        if get_capability(self.client_capabilities, "workspace.code_lens.refresh_support"):
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
        found = diagnostics.diagnostics(self, doc)
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
    ls.problems["initializationOptions"] = problems
    ls.client_name = params.client_info.name if params.client_info else ""
    for problem in problems:
        log.warning("initializationOptions: %s", problem)


@server.feature(t.INITIALIZED)
@guarded()
async def initialized(ls: HtamServer, params: t.InitializedParams) -> None:
    # Everything imported so far lives as long as the server: keep it out of the garbage
    # collector's full passes, which otherwise show up as latency spikes.
    gc.freeze()
    ignored = ls.problems.get("initializationOptions")
    if ignored:
        ls.show("HTAM settings ignored: " + "; ".join(ignored), t.MessageType.Warning)
    await pull_configuration(ls)


@server.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
@guarded()
async def did_change_configuration(ls: HtamServer, params: t.DidChangeConfigurationParams) -> None:
    if isinstance(params.settings, dict) and isinstance(params.settings.get("htam"), dict):
        apply_settings(ls, params.settings["htam"])
    else:
        await pull_configuration(ls)


async def pull_configuration(ls: HtamServer) -> None:
    if not get_capability(ls.client_capabilities, "workspace.configuration"):
        return
    result = await ls.workspace_configuration_async(
        t.ConfigurationParams(items=[t.ConfigurationItem(section="htam")])
    )
    if result:
        apply_settings(ls, result[0])


def apply_settings(ls: HtamServer, raw: Any) -> None:
    """Workspace settings: they may switch execution off, never on (see settings.py)."""
    ls.settings, problems = ls.settings.merged(raw, may_allow=False)
    ls.problems["workspace settings"] = problems
    if not ls.settings.allow_execution or not ls.settings.start_ahead:
        ls.runs.cool()  # nothing runs ahead either
    elif (doc := ls.docs.get(ls.focus)) is not None:
        ls.runs.warm_up(doc)  # switched back on: ready for the kernel in front
    if problems:
        ls.show("HTAM settings ignored: " + "; ".join(problems), t.MessageType.Warning)


# --- documents --------------------------------------------------------------------------


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
@guarded()
def did_open(ls: HtamServer, params: t.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    doc = ls.docs.open(item.uri, item.language_id, item.version, item.text)
    ls.focus = item.uri
    ls.schedule_diagnostics(item.uri)
    ls.runs.interrupted(item.uri)  # a job the last server was running on it
    ls.runs.warm_up(doc)


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
    ls.focus = doc.uri
    ls.schedule_diagnostics(doc.uri)


@server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
@guarded()
def did_close(ls: HtamServer, params: t.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.docs.close(uri)
    ls.runs.cool(uri)
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
    return symbols.symbols(ls, doc) if doc is not None else Prerendered([])


@server.feature(t.TEXT_DOCUMENT_CODE_LENS)
@guarded(default=[])
def code_lens(ls: HtamServer, params: t.CodeLensParams) -> list[t.CodeLens]:
    doc = ls.docs.get(params.text_document.uri)
    return lenses.lenses(ls, doc) if doc is not None else []


@server.feature(t.TEXT_DOCUMENT_HOVER)
@guarded()
def hover(ls: HtamServer, params: t.HoverParams) -> t.Hover | None:
    doc = ls.docs.get(params.text_document.uri)
    if doc is None:
        return None
    ls.focus = doc.uri
    unit = discovery.kernel_around(doc, ls.offset(doc, params.position))
    if unit is None:
        return None
    markdown = light.with_line(rationale.explain(ls, doc, unit), ls.light.line(doc))
    return t.Hover(
        contents=t.MarkupContent(kind=t.MarkupKind.Markdown, value=markdown),
        range=ls.lsp_range(doc, unit.name_start, unit.name_end),
    )


@server.feature(
    t.TEXT_DOCUMENT_CODE_ACTION,
    t.CodeActionOptions(
        code_action_kinds=[t.CodeActionKind.QuickFix, code_actions.ACTION_KIND],
        resolve_provider=True,
    ),
)
@guarded(default=[])
def code_action(ls: HtamServer, params: t.CodeActionParams) -> list[t.CodeAction]:
    doc = ls.docs.get(params.text_document.uri)
    if doc is None:
        return []
    ls.focus = doc.uri
    start = ls.offset(doc, params.range.start)
    found = code_actions.code_actions(ls, doc, start)
    only = params.context.only
    if only:
        found = [a for a in found if any(_kind_matches(a.kind, k) for k in only)]
    return found


def _kind_matches(kind: str | None, wanted: str) -> bool:
    return kind is not None and (kind == wanted or kind.startswith(f"{wanted}."))


@server.feature(t.CODE_ACTION_RESOLVE)
@guarded()
def code_action_resolve(ls: HtamServer, action: t.CodeAction) -> t.CodeAction:
    """The edit of a suggestion against the text as it is now: edits elsewhere in the
    file since the action was listed are fine; an edit of the kernel is refused. Other
    actions (a command such as the compile check, a quick fix with its edit) are complete
    as listed: a client may still ask to resolve them, and gets them back unchanged."""
    data = action.data if isinstance(action.data, dict) else {}
    if "n" not in data:
        return action
    doc = ls.document(data.get("uri"))
    try:
        action.edit = code_actions.suggestion_edit(ls, doc, data)
    except ValueError as error:
        ls.show(str(error), t.MessageType.Warning)
        raise JsonRpcContentModified(str(error)) from None
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


def start_job(ls: HtamServer, arg: dict[str, Any], steps: int) -> dict[str, Any]:
    doc = ls.document(arg.get("uri"))
    return ls.runs.start(doc, _unit(ls, doc, _position(arg)), steps)


@server.command("htam.nextStep")
@guarded()
async def next_step(ls: HtamServer, *args: Any) -> dict[str, Any]:
    return start_job(ls, _argument(args), 1)


@server.command("htam.optimize")
@guarded()
async def optimize(ls: HtamServer, *args: Any) -> dict[str, Any]:
    arg = _argument(args)
    steps = arg.get("steps", ls.settings.steps)
    if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_STEPS <= steps <= MAX_STEPS:
        raise JsonRpcInvalidParams(
            f"HTAM: steps must be an integer from {MIN_STEPS} to {MAX_STEPS}"
        )
    return start_job(ls, arg, steps)


@server.command("htam.compileCheck")
@guarded()
async def compile_check(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """Compile a CUDA kernel with nvcc where no GPU can run it: a job, like a step."""
    arg = _argument(args)
    doc = ls.document(arg.get("uri"))
    return ls.runs.start_check(doc, _unit(ls, doc, _position(arg)))


@server.command("htam.bind")
@guarded()
async def bind(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """The binding quick fix, for a lens: the directive that binds the file to its
    reference, sent to the client with workspace/applyEdit."""
    arg = _argument(args)
    doc = ls.document(arg.get("uri"))
    unit = _unit(ls, doc, _position(arg))
    if not insight.needs_binding(doc):
        return {"applied": False, "message": "HTAM: this file is bound to its reference"}
    title, edit = code_actions.binding_edit(doc, unit)
    reply = await ls.workspace_apply_edit_async(t.ApplyWorkspaceEditParams(edit, label=title))
    return {"applied": reply.applied, "message": reply.failure_reason or title}


@server.command("htam.cancel")
@guarded()
async def cancel(ls: HtamServer, *args: Any) -> dict[str, Any]:
    job_id = _argument(args).get("jobId")
    return {"cancelled": [j.id for j in ls.runs.jobs.cancel(job_id)]}


@server.command("htam.status")
@guarded()
async def htam_status(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """What this server can do here and why (provider, GPU, compilers, sandbox,
    execution, settings): the facts the editors' status bar and health check show."""
    return await status.report(ls)


@server.command("htam.explain")
@guarded()
async def explain(ls: HtamServer, *args: Any) -> dict[str, Any]:
    arg = _argument(args)
    doc = ls.document(arg.get("uri"))
    unit = _unit(ls, doc, _position(arg))
    return {"markdown": light.with_line(rationale.explain(ls, doc, unit), ls.light.line(doc))}


@server.command("htam.results")
@guarded()
async def results(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """The kernel's trajectory, its offered suggestions and the last run's plot."""
    arg = _argument(args)
    doc = ls.document(arg.get("uri"))
    return results_view.results(ls, doc, _unit(ls, doc, _position(arg)))


@server.command("htam.showMemory")
@guarded()
async def show_memory(ls: HtamServer, *args: Any) -> dict[str, Any]:
    """The memory of `backend`, else of the document's backend (`uri` where it is open
    here, else the document the user worked in last), else cuda with a note saying so:
    asked from any buffer (a scratch buffer, a README), it answers."""
    arg = _argument(args)
    uri = arg.get("uri")
    doc = ls.docs.get(uri) if isinstance(uri, str) else None
    doc = doc or ls.docs.get(ls.focus)
    backend = arg.get("backend") or (insight.backend(doc) if doc is not None else "cuda")
    if backend not in BACKENDS:
        raise JsonRpcInvalidParams(f"HTAM: backend must be one of {', '.join(BACKENDS)}")
    return memory_view.memory_summary(ls.graph(backend), memory_view.whose(doc, arg))


def _unit(ls: HtamServer, doc: Document, position: t.Position | None) -> discovery.Unit:
    offset = ls.offset(doc, position) if position is not None else 0
    unit = discovery.unit_at(doc, offset)
    if unit is None:
        raise JsonRpcInvalidParams(
            f"HTAM: no kernel at that position in {doc.uri} (put the cursor in a kernel)"
        )
    return unit


@server.feature(t.WINDOW_WORK_DONE_PROGRESS_CANCEL)
@guarded()
def progress_cancel(ls: HtamServer, params: t.WorkDoneProgressCancelParams) -> None:
    job = ls.runs.jobs.by_token(params.token)
    if job is not None and not job.finished:
        ls.runs.jobs.stop(job)


@server.feature(t.SHUTDOWN)
@guarded()
async def shutdown(ls: HtamServer, params: Any) -> None:
    ls.runs.closing = True
    ls.runs.jobs.cancel()
    ls.light.stop()
    await ls.runs.jobs.cool()


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
