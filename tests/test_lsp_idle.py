"""What an idle editor costs and asks: the process started ahead for the next step (about
1.2 GB while idle) is the `startAhead` setting's to turn off and on, and the memory view
answers from any buffer (the kernel worked in last, or a note that none is open)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from helpers.lsp import REPO, initialize, live_processes, open_file, server_config, wait_until
from lsprotocol import types as t
from pytest_lsp import LanguageClient

EXAMPLE = REPO / "examples" / "softmax"
OPTIONS = {"allowExecution": True, "provider": "offline", "device": "cpu"}


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient):
    lsp_client.feature("htam/jobState")(lambda params: None)
    lsp_client.feature(t.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    yield lsp_client
    if not lsp_client.stopped:  # a failed test: the server still goes
        await lsp_client.shutdown_session()


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    for name in ("cpu_naive.py", "reference.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    return tmp_path / "cpu_naive.py"


def started_ahead(kernel: Path) -> list[int]:
    return live_processes(lambda _group, cmd: "htam_engine.warm" in cmd and str(kernel) in cmd)


async def command(client: LanguageClient, name: str, arg: dict[str, Any]) -> Any:
    return await client.workspace_execute_command_async(t.ExecuteCommandParams(name, [arg]))


@pytest.mark.slow
async def test_the_process_started_ahead_follows_the_start_ahead_setting(
    client: LanguageClient, kernel: Path
) -> None:
    await initialize(client, "neovim", {**OPTIONS, "startAhead": False})
    status = await command(client, "htam.status", {})
    assert status["settings"]["startAhead"] is False and not status["problems"]
    uri = open_file(client, kernel, "python")
    await client.text_document_document_symbol_async(  # the open was handled
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    assert not started_ahead(kernel), "off: nothing is started ahead"
    settings = t.DidChangeConfigurationParams({"htam": {**OPTIONS, "startAhead": True}})
    client.workspace_did_change_configuration(settings)
    await wait_until(lambda: started_ahead(kernel), timeout=60)
    settings = t.DidChangeConfigurationParams({"htam": {**OPTIONS, "startAhead": False}})
    client.workspace_did_change_configuration(settings)
    await wait_until(lambda: not started_ahead(kernel), timeout=60)
    await client.shutdown_session()


async def test_a_bad_start_ahead_value_is_named(client: LanguageClient) -> None:
    await initialize(client, "visual-studio-code", {"startAhead": "no"})
    status = await command(client, "htam.status", {})
    assert status["settings"]["startAhead"] is True
    assert "htam.startAhead: expected true or false" in " ".join(status["problems"])
    await client.shutdown_session()


async def test_the_memory_answers_from_any_buffer(client: LanguageClient, kernel: Path) -> None:
    """From a buffer the server does not have (a scratch buffer, a README): the memory of
    the kernel worked in last, saying so; with no kernel open, a note saying that."""
    await initialize(client, "neovim", {"provider": "offline"})
    alone = await command(client, "htam.showMemory", {"uri": "htam://memory"})
    assert alone["memory"]["backend"] == "cuda"
    assert "No kernel is open: this is the cuda memory" in alone["markdown"]
    open_file(client, kernel, "python")
    readme = (REPO / "README.md").as_uri()
    for asked in ({"uri": readme}, {"uri": "htam://memory"}, {}):
        found = await command(client, "htam.showMemory", asked)
        assert found["memory"]["backend"] == "cpu", asked
        assert "The memory of cpu_naive.py, the kernel you worked in last." in found["markdown"]
    named = await command(client, "htam.showMemory", {"backend": "triton"})
    assert named["memory"]["backend"] == "triton" and "worked in last" not in named["markdown"]
    await client.shutdown_session()
