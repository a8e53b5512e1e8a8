"""`htam.status` says what this machine can do, as kept for every HTAM home on it
(`roofline.cached_path`): the one-line summary the editors show, each round's numbers and
whether they agreed; before any measurement, that there is none yet (the server never
measures: it takes a minute)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from helpers.lsp import initialize, server_config
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from htam_engine import roofline
from htam_engine.roofline import MachineLimits

MIB = 1 << 20


@pytest.fixture(autouse=True)  # first: the server starts in this environment
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own file of limits (the session's may be measured already)."""
    path = tmp_path / "limits.json"
    monkeypatch.setenv(roofline.LIMITS_ENV, str(path))
    return path


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient):
    yield lsp_client
    if not lsp_client.stopped:  # a failed test: the server still goes
        await lsp_client.shutdown_session()


async def status(client: LanguageClient) -> dict[str, Any]:
    answer = await client.workspace_execute_command_async(t.ExecuteCommandParams("htam.status"))
    assert isinstance(answer, dict)
    return answer


def _limits(rounds: list[dict[str, float]]) -> MachineLimits:
    """Limits kept as a measurement in `rounds` leaves them: the best of each number."""
    best = {name: max(r[name] for r in rounds) for name in rounds[0]}
    return MachineLimits(
        fingerprint=roofline.fingerprint(),
        cpu="test cpu",
        isa="avx2",
        fp32_lanes=8,
        cores=2,
        bandwidth={"1": [[MIB, best["1 MiB GB/s"]], [512 * MIB, best["512 MiB GB/s"]]]},
        peak_gflops={"1": best["FP32 GFLOP/s"]},
        numpy_copy_gbs=9.0,
        rounds=rounds,
        stable=not roofline.unsettled(rounds),
    )


async def test_status_shows_the_machine_kept_for_every_home(
    client: LanguageClient, kept: Path
) -> None:
    await initialize(client, "neovim")
    before = (await status(client))["machine"]
    assert before["measured"] is False and "not measured yet" in before["summary"]
    assert before["path"] == str(kept)
    rounds = [
        {"1 MiB GB/s": 90.0, "512 MiB GB/s": 28.1, "FP32 GFLOP/s": 118.0},
        {"1 MiB GB/s": 91.0, "512 MiB GB/s": 35.5, "FP32 GFLOP/s": 117.0},
        {"1 MiB GB/s": 89.0, "512 MiB GB/s": 34.0, "FP32 GFLOP/s": 118.0},
    ]
    kept.write_text(json.dumps(_limits(rounds).to_json()))
    after = (await status(client))["machine"]
    assert after["measured"] is True and after["rounds"] == rounds and after["stable"] is True
    widest = round(100 * (35.5 - 28.1) / 35.5)
    summary = after["summary"]
    assert summary.startswith("one core: 35.5 GB/s past the caches, 118 GFLOP/s FP32")
    assert f"3 rounds, spread up to {widest} % (stable)" in summary, summary
    await client.shutdown_session()
