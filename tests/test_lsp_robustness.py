"""Bad input never kills htam-lsp: the real server process keeps answering."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import pytest_lsp
from helpers.lsp import FIXTURES, initialize, open_file, server_config, wait_until
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

BOUND = FIXTURES / "cuda" / "scale_bound.cu"


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient):
    states: list[dict] = []
    lsp_client.feature("htam/jobState")(lambda params: states.append(dict(params._asdict())))
    lsp_client.feature(t.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    lsp_client.states = states  # type: ignore[attr-defined]
    yield lsp_client
    await lsp_client.shutdown_session()


async def _still_serving(client: LanguageClient) -> None:
    """The server answers a real request about a healthy file."""
    uri = open_file(client, BOUND, "cuda")
    symbols = await client.text_document_document_symbol_async(
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    assert symbols and {s.name for s in symbols} == {"scale", "scale_launch"}


def _open(client: LanguageClient, uri: str, language_id: str, text: str) -> None:
    client.text_document_did_open(
        t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, language_id, 1, text))
    )


async def _symbols(client: LanguageClient, uri: str) -> list:
    found = await client.text_document_document_symbol_async(
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    return list(found or [])


async def test_bad_documents_and_requests(client: LanguageClient, tmp_path: Path):
    await initialize(client, "visual-studio-code")
    # Invalid UTF-8 (a lone surrogate after a lossy decode), a binary file, unbalanced braces.
    _open(client, "file:///w/bad.cu", "cuda", "__global__ void k(\udcff float* a) { a[0] = 1; }\n")
    _open(client, "file:///w/blob.cu", "cuda", "\x00\x01\x7f\x1b[0m\ufffd" * 1000)
    _open(client, "file:///w/open.cu", "cuda", "__global__ void k(float* a) { if (a { {{ \n")
    _open(client, "file:///w/x.rs", "rust", "fn main() {}")
    assert [s.name for s in await _symbols(client, "file:///w/bad.cu")] == ["k"]
    assert await _symbols(client, "file:///w/blob.cu") == []
    assert await _symbols(client, "file:///w/x.rs") == []
    unbalanced = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier("file:///w/open.cu"), t.Position(0, 30))
    )
    assert unbalanced is None or isinstance(unbalanced.contents, t.MarkupContent)
    # Requests and changes for documents that are not open, and out-of-range edits.
    assert await _symbols(client, "file:///w/never-opened.cu") == []
    client.text_document_did_change(
        t.DidChangeTextDocumentParams(
            t.VersionedTextDocumentIdentifier(version=2, uri="file:///w/never-opened.cu"),
            [t.TextDocumentContentChangeWholeDocument("x")],
        )
    )
    client.text_document_did_change(
        t.DidChangeTextDocumentParams(
            t.VersionedTextDocumentIdentifier(version=2, uri="file:///w/bad.cu"),
            [
                t.TextDocumentContentChangePartial(
                    range=t.Range(t.Position(99, 5), t.Position(3, 0)), text="}}}"
                )
            ],
        )
    )
    client.text_document_did_close(
        t.DidCloseTextDocumentParams(t.TextDocumentIdentifier("file:///w/bad.cu"))
    )
    hover = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier("file:///w/bad.cu"), t.Position(0, 18))
    )
    assert hover is None
    await _still_serving(client)
    assert not [m for m in client.messages if m.type == t.MessageType.Error]  # no pop-ups


async def test_bad_command_arguments_get_clear_errors(client: LanguageClient):
    await initialize(client, "neovim", {"allowExecution": True})
    open_file(client, BOUND, "cuda")
    for arguments, message in (
        (["not an object"], "one object argument"),
        ([{"uri": "file:///w/never-opened.cu"}], "is not open"),
        ([{"uri": BOUND.resolve().as_uri(), "steps": "many"}], "steps must be"),
    ):
        with pytest.raises(JsonRpcException, match=message):
            await client.workspace_execute_command_async(
                t.ExecuteCommandParams("htam.optimize", arguments)
            )
    await _still_serving(client)


async def test_ten_megabyte_file(client: LanguageClient):
    await initialize(client, "visual-studio-code")
    line = "__global__ void k(float* a) { a[threadIdx.x] = 1.0f; }\n"
    _open(client, "file:///w/huge.cu", "cuda", line * (10_000_000 // len(line)))
    assert await _symbols(client, "file:///w/huge.cu") == []  # too large to be a kernel
    await _still_serving(client)


async def test_crashed_worker_fails_the_job_not_the_server(client: LanguageClient, tmp_path: Path):
    await initialize(
        client,
        "visual-studio-code",
        {"allowExecution": True, "provider": "offline", "device": "cpu"},
    )
    task = tmp_path / "softmax.py"
    task.write_text((FIXTURES.parents[2] / "examples" / "softmax" / "cpu_naive.py").read_text())
    (tmp_path / "reference.py").write_text(
        (FIXTURES.parents[2] / "examples" / "softmax" / "reference.py").read_text()
    )
    uri = open_file(client, task, "python")
    answer = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.nextStep", [{"uri": uri}])
    )
    assert answer is not None
    job = answer["jobId"]
    states = client.states  # type: ignore[attr-defined]
    running = await wait_until(
        lambda: next((s for s in states if s["jobId"] == job and s["pid"]), None)
    )
    os.killpg(running["pid"], signal.SIGKILL)  # the worker dies without a word
    final = await wait_until(
        lambda: next((s for s in states if s["jobId"] == job and s["state"] == "failed"), None)
    )
    assert "exit code -9" in final["message"]
    await _still_serving(client)


async def test_server_process_never_loads_torch(client: LanguageClient):
    await initialize(client, "neovim")
    uri = open_file(client, FIXTURES / "python" / "inline_relu.py", "python")
    await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), t.Position(6, 40))
    )
    await _symbols(client, uri)
    pid = client._server.pid  # type: ignore[union-attr]
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libtorch" not in maps and "/torch/" not in maps
