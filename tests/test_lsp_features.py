"""htam-lsp over stdio, as VS Code and as Neovim: symbols, hover, lenses, actions, settings."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from helpers.lsp import (
    CLIENTS,
    FIXTURES,
    REPO,
    find,
    initialize,
    open_file,
    server_config,
    wait_until,
)
from helpers.skips import require
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from htam_engine.machine import gpu_present
from htam_lsp.status import COMPILERS

CU = FIXTURES / "cuda" / "vec_add.cu"
BOUND = FIXTURES / "cuda" / "scale_bound.cu"
INLINE = FIXTURES / "python" / "inline_relu.py"
NESTED = FIXTURES / "cuda" / "nested.cu"


@pytest_lsp.fixture(config=server_config(), params=CLIENTS)
async def client(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    lsp_client.spec = request.param  # type: ignore[attr-defined]
    yield lsp_client
    await lsp_client.shutdown_session()


def encoding_of(result: t.InitializeResult) -> str:
    return str(result.capabilities.position_encoding or "utf-16")


async def test_capabilities_and_encoding(client: LanguageClient):
    result = await initialize(client, client.spec)  # type: ignore[attr-defined]
    caps = result.capabilities
    assert caps.text_document_sync.change == t.TextDocumentSyncKind.Incremental  # type: ignore[union-attr]
    assert isinstance(caps.code_action_provider, t.CodeActionOptions)
    assert caps.code_action_provider.resolve_provider is True
    assert "refactor.rewrite.htam" in (caps.code_action_provider.code_action_kinds or [])
    commands = set(caps.execute_command_provider.commands)  # type: ignore[union-attr]
    assert {
        "htam.nextStep",
        "htam.optimize",
        "htam.cancel",
        "htam.explain",
        "htam.showMemory",
    } <= commands
    # Neovim offers utf-8 first; VS Code only speaks utf-16.
    expected = "utf-8" if client.spec == "neovim" else "utf-16"  # type: ignore[attr-defined]
    assert encoding_of(result) == expected


async def test_symbols_of_embedded_cuda_map_to_file_positions(client: LanguageClient):
    result = await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, INLINE, "python")
    symbols = await client.text_document_document_symbol_async(
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    flat = {s.name: s for s in symbols or []}  # type: ignore[union-attr]
    assert {"relu_kernel", "relu_forward", "load_inline", "ModelNew"} <= set(flat)
    kernel = flat["relu_kernel"]
    assert isinstance(kernel, t.DocumentSymbol)
    assert "__global__" in (kernel.detail or "")
    # The kernel name follows non-ASCII text on its line: its column depends on the encoding.
    text = INLINE.read_text(encoding="utf-8")
    assert kernel.selection_range.start == find(text, "relu_kernel(", encoding_of(result))


async def test_symbols_of_kernels_in_namespaces_ifdefs_templates_and_structs(
    client: LanguageClient,
):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, NESTED, "cuda")
    symbols = await client.text_document_document_symbol_async(
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    names = {s.name for s in symbols or []}
    assert {"fast_scale", "slow_scale", "run"} <= names


async def test_hover_before_any_run_shows_memory_directions(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, CU, "cuda")
    text = CU.read_text(encoding="utf-8")
    hover = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), find(text, "threadIdx", "utf-16"))
    )
    assert hover is not None and isinstance(hover.contents, t.MarkupContent)
    markdown = hover.contents.value
    assert "vec_add" in markdown
    assert "No HTAM run yet" in markdown
    assert "| direction | score | p |" in markdown and "alpha" in markdown
    outside = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), t.Position(0, 0))
    )
    assert outside is None


async def test_code_lens_over_each_kernel(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, INLINE, "python")
    lenses = await client.text_document_code_lens_async(
        t.CodeLensParams(t.TextDocumentIdentifier(uri))
    )
    titles = [(lens.command.title, lens.command.command) for lens in lenses or [] if lens.command]
    assert ("Optimize with HTAM", "htam.nextStep") in titles
    # relu_kernel (CUDA) and ModelNew each get one; the host launcher does not.
    assert len([1 for title, _ in titles if title == "Optimize with HTAM"]) == 2


async def test_unbound_cu_gets_binding_quickfix_and_static_hints(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, CU, "cuda")
    await wait_until(lambda: uri in client.diagnostics)
    codes = {d.code for d in client.diagnostics[uri]}
    assert {"no_restrict", "no_bounds_check", "unbound"} <= codes
    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri),
            t.Range(t.Position(3, 4), t.Position(3, 4)),
            t.CodeActionContext(diagnostics=[]),
        )
    )
    fixes = [a for a in actions or [] if isinstance(a, t.CodeAction) and a.kind == "quickfix"]
    assert len(fixes) == 1
    edit = fixes[0].edit.changes[uri][0]  # type: ignore[union-attr, index]
    # The reference is guessed from the sibling vec_add_ref.py; entry is the host launcher.
    assert edit.new_text == "// htam: reference=vec_add_ref.py entry=vec_add_launch\n"
    assert edit.range.start == t.Position(0, 0)


async def test_an_unbound_python_kernel_is_offered_the_binding_instead_of_optimize(
    client: LanguageClient, tmp_path: Path
):
    """A `ModelNew` without `# htam: reference=`: a step could only fail (it is no
    reference either), so its lenses bind it; a step asked for anyway is refused, naming
    the file, and bound it gets "Optimize with HTAM"."""
    await initialize(client, client.spec, {"allowExecution": True})  # type: ignore[attr-defined]
    applied: list[t.ApplyWorkspaceEditParams] = []

    @client.feature(t.WORKSPACE_APPLY_EDIT)
    def on_apply(params: t.ApplyWorkspaceEditParams) -> t.ApplyWorkspaceEditResult:
        applied.append(params)
        return t.ApplyWorkspaceEditResult(applied=True)

    shutil.copy(INLINE.parent / "relu_ref.py", tmp_path / "relu_ref.py")
    directive, text = INLINE.read_text(encoding="utf-8").split("\n", 1)
    assert "htam: reference=relu_ref.py" in directive and "htam:" not in text
    path = tmp_path / "relu_new.py"
    path.write_text(text, encoding="utf-8")
    uri = open_file(client, path, "python")
    doc = t.TextDocumentIdentifier(uri)

    lenses = await client.text_document_code_lens_async(t.CodeLensParams(doc))
    commands = [lens.command for lens in lenses or [] if lens.command]
    bind = "HTAM: bind to its reference (# htam: reference=relu_ref.py)"
    assert commands, "each kernel has a lens"
    assert all((c.title, c.command) == (bind, "htam.bind") for c in commands), commands
    await wait_until(lambda: any(d.code == "unbound" for d in client.diagnostics.get(uri, [])))
    said = next(d.message for d in client.diagnostics[uri] if d.code == "unbound")
    assert "# htam: reference=REF.py" in said and "//" not in said

    refused = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.nextStep", [{"uri": uri}])
    )
    assert refused is not None and refused["state"] == "refused", refused
    assert "relu_new.py is not bound" in refused["message"], refused
    assert str(tmp_path) not in refused["message"] and "KernelBench" not in refused["message"]

    answer = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(commands[0].command, commands[0].arguments)
    )
    assert answer is not None and answer["applied"] is True, answer
    [asked] = applied
    [edit] = (asked.edit.changes or {})[uri]
    assert (edit.new_text, edit.range.start) == (directive + "\n", t.Position(0, 0))

    client.text_document_did_change(
        t.DidChangeTextDocumentParams(
            t.VersionedTextDocumentIdentifier(version=2, uri=uri),
            [t.TextDocumentContentChangeWholeDocument(edit.new_text + text)],
        )
    )
    lenses = await client.text_document_code_lens_async(t.CodeLensParams(doc))
    titles = [lens.command.title for lens in lenses or [] if lens.command]
    assert titles.count("Optimize with HTAM") == len(commands) and bind not in titles, titles


async def test_bound_cu_has_no_binding_fix_and_no_hints(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, BOUND, "cuda")
    await wait_until(lambda: uri in client.diagnostics)
    assert list(client.diagnostics[uri]) == []
    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri),
            t.Range(t.Position(3, 0), t.Position(3, 0)),
            t.CodeActionContext(diagnostics=[]),
        )
    )
    assert not [a for a in actions or [] if isinstance(a, t.CodeAction) and a.kind == "quickfix"]


async def test_execution_refused_without_permission(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, BOUND, "cuda")
    answer = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(
            "htam.nextStep", [{"uri": uri, "position": {"line": 1, "character": 20}}]
        )
    )
    assert answer is not None
    assert answer["state"] == "refused"
    advice = {"neovim": "allow_execution = true", "visual-studio-code": "trust the workspace"}
    assert advice[client.spec] in answer["message"]  # type: ignore[attr-defined]
    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri),
            t.Range(t.Position(3, 0), t.Position(3, 0)),
            t.CodeActionContext(diagnostics=[]),
        )
    )
    disabled = [a for a in actions or [] if isinstance(a, t.CodeAction) and a.disabled]
    if client.spec == "visual-studio-code":  # type: ignore[attr-defined]
        assert any("not allowed" in a.disabled.reason for a in disabled)  # type: ignore[union-attr]
    else:  # Neovim 0.11 does not support disabled actions: none are sent
        assert disabled == []
    assert not any(a.title.startswith("HTAM: run") for a in actions or [])


async def test_workspace_settings_cannot_grant_execution(client: LanguageClient):
    client.set_configuration(
        {"allowExecution": True, "steps": 0, "provider": "offline"}, section="htam"
    )
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, BOUND, "cuda")
    # A bad value is reported; allowExecution from workspace settings is ignored.
    await wait_until(lambda: any("htam.steps" in m.message for m in client.messages))
    answer = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.nextStep", [{"uri": uri}])
    )
    assert answer is not None
    assert answer["state"] == "refused"


async def test_explain_and_show_memory_commands(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, BOUND, "cuda")
    explained = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.explain", [{"uri": uri}])
    )
    assert explained is not None
    assert "scale" in explained["markdown"]
    memory = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.showMemory", [{"backend": "cpu"}])
    )
    assert memory is not None
    assert memory["memory"]["backend"] == "cpu"
    assert memory["memory"]["directions"] and "| direction |" in memory["markdown"]
    cpu_uri = open_file(client, REPO / "examples" / "softmax" / "cpu_naive.py", "python")
    # Without a uri (the focus is on a preview, say): the document worked in last.
    focused = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.showMemory", [{}])
    )
    assert focused is not None and focused["memory"]["backend"] == "cpu"
    for open_uri, backend in ((cpu_uri, "cpu"), (uri, "cuda")):
        shown = await client.workspace_execute_command_async(
            t.ExecuteCommandParams("htam.showMemory", [{"uri": open_uri}])
        )
        assert shown is not None
        assert shown["memory"]["backend"] == backend  # the open kernel's own memory


async def test_actions_say_why_strategies_cannot_run(client: LanguageClient):
    spec = client.spec  # type: ignore[attr-defined]
    await initialize(client, spec, {"allowExecution": True, "provider": "offline"})
    cuda_uri = open_file(client, BOUND, "cuda")
    cpu_uri = open_file(client, REPO / "examples" / "softmax" / "cpu_naive.py", "python")
    run = "HTAM: run the next optimization step"

    async def actions(uri: str) -> list[t.CodeAction | t.Command]:
        # lsprotocol reads a CodeAction that carries a command as a Command: keep both.
        found = await client.text_document_code_action_async(
            t.CodeActionParams(
                t.TextDocumentIdentifier(uri),
                t.Range(t.Position(3, 0), t.Position(3, 0)),
                t.CodeActionContext(diagnostics=[]),
            )
        )
        return list(found or [])

    cpu = await actions(cpu_uri)
    assert any(a.title.startswith(run) for a in cpu), [a.title for a in cpu]
    cuda = await actions(cuda_uri)
    reasons = [a.disabled.reason for a in cuda + cpu if isinstance(a, t.CodeAction) and a.disabled]
    if spec == "neovim":  # no `disabled` support: nothing unrunnable is offered
        assert reasons == []
        return
    assert any("no LLM configured" in r for r in reasons)
    assert any(a.title.startswith(run) for a in cuda) == gpu_present()
    assert any("no GPU" in r for r in reasons) == (not gpu_present())


async def test_auto_provider_without_keys_says_mechanical_only(client: LanguageClient):
    """Before any job has run, the server reads the environment the way a step would."""
    spec = client.spec  # type: ignore[attr-defined]
    await initialize(client, spec, {"allowExecution": True})  # provider: auto
    if spec == "neovim":  # after initialize: the fixture's shutdown waits for an initialized server
        pytest.skip("Neovim 0.11 does not support disabled code actions")
    uri = open_file(client, REPO / "examples" / "softmax" / "cpu_naive.py", "python")
    found = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri),
            t.Range(t.Position(3, 0), t.Position(3, 0)),
            t.CodeActionContext(diagnostics=[]),
        )
    )
    reasons = [a.disabled.reason for a in found or [] if isinstance(a, t.CodeAction) and a.disabled]
    assert any("no API key or base URL in the environment" in r for r in reasons), reasons


async def _run(client: LanguageClient, command: str, arg: dict[str, Any]) -> dict[str, Any]:
    answer = await client.workspace_execute_command_async(t.ExecuteCommandParams(command, [arg]))
    assert isinstance(answer, dict), answer
    return answer


async def test_cuda_without_a_gpu_is_refused_at_once_with_the_reason(client: LanguageClient):
    """The server knows before starting that no CUDA candidate can run: it says so."""
    spec = client.spec  # type: ignore[attr-defined]
    await initialize(client, spec, {"allowExecution": True, "provider": "offline"})
    uri = open_file(client, BOUND, "cuda")
    answer = await _run(client, "htam.nextStep", {"uri": uri})
    assert (answer["state"] == "refused") == (not gpu_present()), answer
    if not gpu_present():
        assert "a CUDA kernel needs an NVIDIA GPU" in answer["message"]
        assert "there is none here" in answer["message"]
        check = {"neovim": ":HtamCheck", "visual-studio-code": "HTAM: Compile-Check with nvcc"}
        assert check[spec] in answer["message"]  # what to run instead, in this client
    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams({"htam": {"device": "cpu"}})
    )
    forced = await _run(client, "htam.nextStep", {"uri": uri})
    if forced.get("alreadyRunning"):  # a GPU machine: the first job is still going
        await _run(client, "htam.cancel", {})
        return
    assert forced["state"] == "refused" and "and the device setting is cpu" in forced["message"]


async def test_status_says_what_the_server_can_do_here(client: LanguageClient):
    spec = client.spec  # type: ignore[attr-defined]
    await initialize(client, spec, {"provider": "offline", "minSpeedup": 0.5, "colour": 1})
    status = await _run(client, "htam.status", {})
    assert status["provider"]["name"] == "offline" and status["provider"]["why"]
    assert status["gpu"]["present"] == gpu_present()
    assert status["device"]["name"] == ("cuda" if gpu_present() else "cpu")
    assert status["compilers"] == {c: shutil.which(c) for c in COMPILERS}
    assert status["sandbox"]["mode"] in ("bwrap", "none") and status["sandbox"]["why"]
    assert status["execution"]["allowed"] is False
    advice = {"neovim": "allow_execution = true", "visual-studio-code": "Workspace Trust"}
    assert advice[spec] in status["execution"]["howToAllow"]
    assert status["settings"]["minSpeedup"] == 1.1  # the bad value was not taken
    problems = " ".join(status["problems"])
    assert "htam.minSpeedup" in problems and "htam.colour" in problems


async def test_plain_modules_and_references_get_nothing(client: LanguageClient, tmp_path: Path):
    """HTAM attaches to kernel files only: no lens, action, hover or symbol elsewhere."""
    await initialize(client, client.spec, {"allowExecution": True})  # type: ignore[attr-defined]
    plain = tmp_path / "net.py"
    plain.write_text(
        "import torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return x * 2\n"
    )
    for path in (plain, INLINE.parent / "relu_ref.py"):
        uri = open_file(client, path, "python")
        where = t.Position(3, 8)
        doc = t.TextDocumentIdentifier(uri)
        lenses = await client.text_document_code_lens_async(t.CodeLensParams(doc))
        actions = await client.text_document_code_action_async(
            t.CodeActionParams(doc, t.Range(where, where), t.CodeActionContext([]))
        )
        hover = await client.text_document_hover_async(t.HoverParams(doc, where))
        symbols = await client.text_document_document_symbol_async(t.DocumentSymbolParams(doc))
        assert (list(lenses or []), list(actions or []), hover, symbols) == ([], [], None, [])


@pytest.mark.slow
async def test_cuda_without_a_gpu_gets_an_nvcc_compile_check(
    client: LanguageClient, tmp_path: Path
):
    """The code action the refusal points to: nvcc compiles the buffer; an error is a
    diagnostic on its line, in the evaluator's words."""
    require("nvcc is not on PATH" if shutil.which("nvcc") is None else None)
    if gpu_present():
        pytest.skip("a GPU is here: CUDA steps run instead")
    spec = client.spec  # type: ignore[attr-defined]
    await initialize(client, spec, {"allowExecution": True, "provider": "offline"})
    for name in (BOUND.name, "vec_add_ref.py"):
        shutil.copy(BOUND.parent / name, tmp_path / name)
    text = (tmp_path / BOUND.name).read_text()
    uri = open_file(client, tmp_path / BOUND.name, "cuda")
    where = t.Position(1, 20)
    found = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri), t.Range(where, where), t.CodeActionContext([])
        )
    )
    titles = [a.title for a in found or []]
    assert any("compile-check scale with nvcc" in title for title in titles), titles
    # VS Code asks to resolve every action without an edit: the check comes back as it was.
    # (pytest-lsp reads an action with a command back as a Command: send it as VS Code does)
    title = next(title for title in titles if "nvcc" in title)
    command = t.Command("HTAM: compile check", "htam.compileCheck", arguments=[{"uri": uri}])
    action = t.CodeAction(title, kind="refactor.rewrite.htam.check", command=command)
    resolved = await client.code_action_resolve_async(action)
    assert resolved.command is not None and resolved.edit is None
    assert (resolved.command.command, list(resolved.command.arguments or [])) == (
        "htam.compileCheck",
        [{"uri": uri}],
    )
    states: list[dict[str, Any]] = []
    client.feature("htam/jobState")(lambda params: states.append(dict(params._asdict())))
    refreshed: list[int] = []
    client.feature(t.WORKSPACE_CODE_LENS_REFRESH)(lambda params: refreshed.append(len(states)))

    async def check() -> dict[str, Any]:
        answer = await _run(client, "htam.compileCheck", {"uri": uri})
        return await wait_until(
            lambda: next(
                (
                    s
                    for s in states
                    if s["jobId"] == answer["jobId"] and s["state"] in ("done", "failed")
                ),
                None,
            ),
            timeout=120,
        )

    first = await check()
    assert first["state"] == "done" and "compiled with nvcc" in first["message"], first
    broken = text.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i]")
    client.text_document_did_change(
        t.DidChangeTextDocumentParams(
            t.VersionedTextDocumentIdentifier(version=2, uri=uri),
            [t.TextDocumentContentChangeWholeDocument(broken)],
        )
    )
    second = await check()
    # The user's own file and line, in nvcc's words; no scratch file is named.
    said = f'{BOUND.name} line 6 does not compile with nvcc: error: expected a ";"'
    assert second["state"] == "failed" and second["message"] == said, second
    diagnostics = await wait_until(
        lambda: [d for d in client.diagnostics.get(uri, []) if d.code == "compile_check_error"]
    )
    assert diagnostics[0].range.start.line == 5  # the line nvcc named (its line 6)
    assert (
        diagnostics[0].message
        == 'HTAM compile check: nvcc rejects this line: error: expected a ";"'
    )
    # The client was told to refresh its lenses after the check ended: no stale "(cancel)".
    if spec == "visual-studio-code":  # Neovim 0.11 does not advertise lens refresh
        ended = next(i for i, s in enumerate(states, 1) if s["state"] == "failed")
        await wait_until(lambda: any(n >= ended for n in refreshed))
    lenses = await client.text_document_code_lens_async(
        t.CodeLensParams(t.TextDocumentIdentifier(uri))
    )
    titles = [lens.command.title for lens in lenses or [] if lens.command]
    assert titles and not any("(cancel)" in title for title in titles), titles


async def test_triton_kernels_get_lenses_and_their_own_memory(client: LanguageClient):
    await initialize(client, client.spec)  # type: ignore[attr-defined]
    uri = open_file(client, REPO / "examples" / "softmax" / "triton_naive.py", "python")
    lenses = await client.text_document_code_lens_async(
        t.CodeLensParams(t.TextDocumentIdentifier(uri))
    )
    titles = [lens.command.title for lens in lenses or [] if lens.command]
    assert titles.count("Optimize with HTAM") == 2  # the @triton.jit kernel and ModelNew
    shown = await _run(client, "htam.showMemory", {"uri": uri})
    assert shown["memory"]["backend"] == "triton"
