"""A small pygls server that speaks HTAM's editor protocol with canned results.

It lets the plugin's Lua tests run in seconds, without the engine: one step "finds"
two candidates, and the code actions replace the document with a marked candidate.
The real end-to-end story is tested against `htam-lsp` in e2e.lua.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer

KIND = "refactor.rewrite.htam"
# A busy server: a lens asked for while a job runs is answered a second later, and a job
# ends while the lens asked for after its last step is in flight (htam-lsp records and
# confirms the job then): that answer arrives after the end, saying the job runs.
LENS_DELAY_S = 1.0
CANDIDATES = {"cpu.omp_simd": 1.25, "cpu.omp_parallel_for": 1.75}

server = LanguageServer("htam-fixture", "0")
state: dict[str, Any] = {"init": None, "done": set(), "jobs": 0, "cancelled": [], "running": {}}
state["lenses_in_flight"] = 0


@server.feature(types.INITIALIZE)
def initialize(ls: LanguageServer, params: types.InitializeParams) -> None:
    state["init"] = params.initialization_options


async def run_job(ls: LanguageServer, job_id: str, uri: str, steps: int) -> None:
    token = f"htam-{job_id}"
    await ls.work_done_progress.create_async(token)
    ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title="HTAM", cancellable=True))
    for step in range(1, steps + 1):
        job = {"jobId": job_id, "uri": uri, "kernel": "ModelNew", "steps": steps, "step": step}
        message = f"step {step}/{steps}: compile"
        state["running"][uri] = message
        running = {"state": "running", "phase": "compile", "message": message}
        ls.protocol.notify("htam/jobState", {**job, **running})
        ls.work_done_progress.report(token, types.WorkDoneProgressReport(message="compile"))
        await asyncio.sleep(0.05)
    for _ in range(int(2 * LENS_DELAY_S / 0.05)):  # end while a lens is in flight
        if state["lenses_in_flight"]:
            break
        await asyncio.sleep(0.05)
    ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message="done"))
    state["running"].pop(uri, None)
    state["done"].add(uri)
    best = max(CANDIDATES.values())
    message = f"best {best:.2f}x faster than your code; apply it from the code actions"
    done = {"state": "done", "bestSpeedup": best, "message": message, "suggestions": 2}
    ls.protocol.notify("htam/jobState", {**job, **done})


def start(ls: LanguageServer, args: dict[str, Any], steps: int) -> dict[str, str]:
    state["jobs"] += 1
    job_id = str(state["jobs"])
    asyncio.get_running_loop().create_task(run_job(ls, job_id, args["uri"], steps))
    return {"jobId": job_id}


@server.command("htam.nextStep")
async def next_step(ls: LanguageServer, args: dict[str, Any]) -> dict[str, str]:
    return start(ls, args, 1)


@server.command("htam.optimize")
async def optimize(ls: LanguageServer, args: dict[str, Any]) -> dict[str, str]:
    return start(ls, args, int(args.get("steps") or 2))


@server.command("htam.cancel")
def cancel(ls: LanguageServer, args: dict[str, Any]) -> dict[str, list[str]]:
    """Like htam-lsp: the ids of the jobs it stops (none without a running one)."""
    job = args.get("jobId")
    state["cancelled"].append(job)
    return {"cancelled": [job] if job and state["running"] else []}


@server.command("htam.explain")
def explain(ls: LanguageServer, args: dict[str, Any]) -> dict[str, str]:
    return {"markdown": f"# HTAM rationale\n\nchosen: **Parallelism** for `{args['uri']}`"}


@server.command("htam.results")
def results(ls: LanguageServer, args: dict[str, Any]) -> dict[str, Any]:
    offered = [
        {"title": f"apply {name}: {gain:.2f}x faster", "line": 2, "speedup": gain}
        for name, gain in CANDIDATES.items()
    ]
    markdown = "### HTAM results: `ModelNew`\n\n| # | outcome |\n|---|---|\n| 1 | improved |\n"
    return {"markdown": markdown, "kernel": "ModelNew", "suggestions": offered, "plot": None}


@server.command("htam.showMemory")
def show_memory(ls: LanguageServer, args: dict[str, Any]) -> dict[str, Any]:
    return {"markdown": f"# HTAM memory\n\nbackend: {args.get('backend', 'all')}", "memory": {}}


@server.command("htam.status")
def status(ls: LanguageServer, *args: Any) -> dict[str, Any]:
    """The shape of htam-lsp's answer, with this fixture's values."""
    init = state["init"] or {}
    return {
        "provider": {"name": init.get("provider", "auto"), "why": "provider setting"},
        "gpu": {"present": False, "name": None},
        "device": {"name": "cpu", "why": "auto: no NVIDIA GPU here"},
        "compilers": {"nvcc": None, "g++": "/usr/bin/g++"},
        "sandbox": {"mode": "none", "why": "no bubblewrap here"},
        "execution": {
            "allowed": bool(init.get("allowExecution")),
            "howToAllow": "require('htam').setup({ allow_execution = true })",
        },
        "machine": {
            "measured": True,
            "summary": "one core: 31.2 GB/s past the caches; 3 rounds, spread up to 9 % (stable)",
            "stable": True,
            "measuredAt": "2026-12-06T13:27:52Z",
            "path": "/cache/htam/machine/0123456789abcdef.json",
        },
        "problems": [],
    }


@server.command("fixture.state")
def fixture_state(ls: LanguageServer) -> dict[str, Any]:
    return {"init": state["init"], "cancelled": state["cancelled"]}


@server.feature(types.TEXT_DOCUMENT_CODE_LENS)
async def code_lens(ls: LanguageServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    """Like htam-lsp's: over the kernel (line 3), the running job with Cancel, or Optimize
    (`LENS_DELAY_S` late while a job runs)."""
    running = state["running"].get(params.text_document.uri)
    if running:
        state["lenses_in_flight"] += 1
        await asyncio.sleep(LENS_DELAY_S)
        state["lenses_in_flight"] -= 1
    title = f"HTAM: {running} (cancel)" if running else "Optimize with HTAM"
    where = types.Range(types.Position(2, 6), types.Position(2, 14))
    command = types.Command(title, "htam.cancel" if running else "htam.nextStep")
    return [types.CodeLens(where, command)]


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[KIND], resolve_provider=True),
)
def code_actions(ls: LanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    if uri not in state["done"]:
        return []
    return [
        types.CodeAction(
            title=f"HTAM: apply Parallelism -> {name}: {speedup:.2f}x faster, correct",
            kind=f"{KIND}.{name}",
            data={"uri": uri, "name": name, "speedup": speedup},
        )
        for name, speedup in CANDIDATES.items()
    ]


@server.feature(types.CODE_ACTION_RESOLVE)
def resolve(ls: LanguageServer, action: types.CodeAction) -> types.CodeAction:
    data: dict[str, str] = action.data or {}
    uri, name = data["uri"], data["name"]
    lines = len(ls.workspace.get_text_document(uri).lines)
    whole = types.Range(types.Position(0, 0), types.Position(lines + 1, 0))
    text = f"# candidate {name}\n"
    action.edit = types.WorkspaceEdit(changes={uri: [types.TextEdit(whole, text)]})
    return action


if __name__ == "__main__":
    server.start_io()
