"""The language server starts the next job ahead (`JobManager.warm_up`): a bound kernel
opened where execution is allowed has a spare judge and its workers started for its task
before any step is asked for; closing the file or shutting the server down ends them."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from helpers.lsp import REPO, initialize, live_processes, open_file, server_config, wait_until
from lsprotocol import types as t
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "softmax"
OPTIONS = {"allowExecution": True, "provider": "offline", "device": "cpu"}


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient):
    states: list[dict[str, Any]] = []
    lsp_client.feature("htam/jobState")(lambda params: states.append(dict(params._asdict())))
    lsp_client.states = states  # type: ignore[attr-defined]
    lsp_client.feature(t.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    yield lsp_client  # each test shuts the server down itself


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    for name in ("cpu_naive.py", "reference.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    return tmp_path / "cpu_naive.py"


def spares(home: Path) -> list[Path]:
    """Job folders of started judges waiting for a candidate, and their live judges."""
    folders = [d for d in (home / "jobs").glob("eval-*") if (d / "standby.json").is_file()]
    judges = live_processes(
        lambda _group, cmd: "htam_engine.evaluate.judge" in cmd and str(home) in cmd
    )
    return folders if judges else []


def warm_processes(home: Path, kernel: Path) -> list[int]:
    return live_processes(lambda _group, cmd: "htam_engine.warm" in cmd and str(kernel) in cmd)


async def test_a_spare_stands_by_for_an_open_bound_kernel_until_shutdown(
    client: LanguageClient, kernel: Path, htam_home: Path
) -> None:
    await initialize(client, "visual-studio-code", OPTIONS)
    uri = open_file(client, kernel, "python")
    (folder,) = await wait_until(lambda: spares(htam_home), timeout=120)
    assert "reference.py" in {p.name for p in folder.iterdir()}, "the kernel's own task"
    assert warm_processes(htam_home, kernel)

    client.text_document_did_close(t.DidCloseTextDocumentParams(t.TextDocumentIdentifier(uri)))
    await wait_until(lambda: not spares(htam_home) and not warm_processes(htam_home, kernel))
    assert not folder.exists(), "closed with its file: the judge cleaned up"

    open_file(client, kernel, "python")
    await wait_until(lambda: spares(htam_home), timeout=120)
    await client.shutdown_session()
    await wait_until(lambda: not spares(htam_home) and not warm_processes(htam_home, kernel))
    assert not list((htam_home / "jobs").iterdir())


async def test_the_next_step_runs_in_the_process_started_ahead(
    client: LanguageClient, kernel: Path, htam_home: Path
) -> None:
    """The job is the warm process itself (its pid), it takes the spare (the folder
    started at didOpen is used and gone), and it ends as a cold job would."""
    await initialize(client, "visual-studio-code", OPTIONS)
    uri = open_file(client, kernel, "python")
    (folder,) = await wait_until(lambda: spares(htam_home), timeout=120)
    (warm,) = warm_processes(htam_home, kernel)
    answer = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.nextStep", [{"uri": uri}])
    )
    states = client.states  # type: ignore[attr-defined]

    def final() -> dict[str, Any] | None:
        done = [s for s in states if s["jobId"] == answer["jobId"] and s["state"] == "done"]
        return done[-1] if done else None

    ended = await wait_until(final, timeout=400)
    assert ended["pid"] == warm, "served by the process started ahead"
    assert not folder.exists(), "its spare judge served the first evaluation"
    await wait_until(lambda: warm_processes(htam_home, kernel), timeout=60)  # the next one
    await client.shutdown_session()
    await wait_until(lambda: not spares(htam_home) and not warm_processes(htam_home, kernel))


@pytest.mark.parametrize("why", ["execution not allowed", "not bound"])
async def test_no_spare_where_no_job_could_run(
    client: LanguageClient, kernel: Path, htam_home: Path, why: str
) -> None:
    await initialize(
        client, "visual-studio-code", {**OPTIONS, "allowExecution": why == "not bound"}
    )
    if why == "not bound":
        kernel.write_text(kernel.read_text().replace("# htam: reference=reference.py", ""))
    uri = open_file(client, kernel, "python")
    await client.text_document_document_symbol_async(  # the open was handled
        t.DocumentSymbolParams(t.TextDocumentIdentifier(uri))
    )
    await asyncio.sleep(2)  # a process started in the background would be there by now
    assert not warm_processes(htam_home, kernel) and not spares(htam_home)
    await client.shutdown_session()
