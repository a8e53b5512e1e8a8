"""The hover says where the current code stands against this machine before any step
(`htam_lsp.light`): its time, the floor, the share of this core's bandwidth or FLOP/s it
reaches, and PyTorch's time, measured by a real `htam eval` of the buffer."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
import pytest_lsp
from helpers.lsp import REPO, initialize, open_file, server_config
from lsprotocol import types as t
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "softmax"
OPTIONS = {"allowExecution": True, "provider": "offline", "device": "cpu"}
LINE = re.compile(
    r"\*\*Speed of light\*\*: your code (?P<time>[\d.e+-]+) ms; its floor here "
    r"(?P<floor>[\d.e+-]+) ms: at (?P<share>\d+) % of this core's (?P<what>[a-zA-Z0-9 ]+) "
    r"\((?P<got>[\d.e+-]+) of (?P<limit>[\d.e+-]+) (?P<unit>[A-Za-z/]+)[^)]*\)"
    r"(?: - faster than light)?; "
    r"PyTorch (?P<torch>[\d.e+-]+) ms \(at (?P<torch_share>\d+) %\)"
)


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient):
    lsp_client.feature("htam/jobState")(lambda params: None)
    lsp_client.feature(t.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    yield lsp_client


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    for name in ("cpu_naive.py", "reference.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    return tmp_path / "cpu_naive.py"


async def hover(client: LanguageClient, uri: str) -> str:
    text = Path(uri.removeprefix("file://")).read_text()
    line = next(i for i, s in enumerate(text.splitlines()) if "class ModelNew" in s)
    found = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), t.Position(line, 8))
    )
    assert found is not None and isinstance(found.contents, t.MarkupContent)
    return found.contents.value


async def test_the_hover_places_the_current_code_on_the_roofline_before_any_step(
    client: LanguageClient, kernel: Path
) -> None:
    await initialize(client, "neovim", OPTIONS)
    uri = open_file(client, kernel, "python")
    first = await hover(client, uri)
    assert "**Speed of light**: measuring your code" in first, first

    async def measured() -> re.Match[str] | None:
        return LINE.search(await hover(client, uri))

    async def poll() -> re.Match[str]:
        while (found := await measured()) is None:
            await asyncio.sleep(1)
        return found

    found = await asyncio.wait_for(poll(), 300)
    time_ms, floor_ms = float(found["time"]), float(found["floor"])
    assert min(floor_ms, time_ms, float(found["torch"])) > 0
    # one placement: the share is the floor (the harness's share of a call in it) over
    # the time; the rate over the whole call, harness and all, is no more than that share
    assert abs(int(found["share"]) - 100 * floor_ms / time_ms) <= 1  # both rounded
    assert float(found["got"]) / float(found["limit"]) < floor_ms / time_ms + 0.02
    heading, _, rest = (await hover(client, uri)).partition("\n\n")
    assert heading.startswith("### HTAM") and rest.startswith("**Speed of light**")
    await client.shutdown_session()


async def test_nothing_is_measured_where_no_step_could_run(
    client: LanguageClient, kernel: Path
) -> None:
    await initialize(client, "neovim", {**OPTIONS, "allowExecution": False})
    uri = open_file(client, kernel, "python")
    for _ in range(2):  # a measurement started by the first would show in the second
        assert "Speed of light" not in await hover(client, uri)
    await client.shutdown_session()
