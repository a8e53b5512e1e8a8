"""A stand-in engine for the language server's tests (tests/fixtures/lsp/fake_engine.py):
scripted `htam optimize --events` runs whose numbers are exactly known, the events to script
them with, and the LSP requests the tests read their outcome by."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from lsprotocol import types as t
from pytest_lsp import ClientServerConfig, LanguageClient

from helpers.lsp import FIXTURES, server_config

FAKE = Path(tempfile.mkdtemp(prefix="htam-fake-engine-"))
SCRIPT, LOG = FAKE / "script.json", FAKE / "argv.jsonl"
OPTIONS = {"allowExecution": True, "provider": "offline", "device": "cpu", "minSpeedup": 1.1}
TERMINAL = {"done", "failed", "cancelled", "refused"}
START_REF = 0.5  # the starting code over PyTorch, with its interval 0.48-0.52


def scripted_config() -> ClientServerConfig:
    return server_config(
        HTAM_LSP_ENGINE="fake_engine",
        PYTHONPATH=os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]),
        HTAM_FAKE_ENGINE_SCRIPT=str(SCRIPT),
        HTAM_FAKE_ENGINE_LOG=str(LOG),
    )


def plain(params: Any) -> dict[str, Any]:
    return dict(params) if isinstance(params, dict) else dict(params._asdict())


def step(n: int, local: str, ref: tuple[float, float, float] | None, replace: list[str]) -> dict:
    """A step event: correct with its speedup over PyTorch `ref` (estimate, low, high),
    or, with `ref` None, a compile error."""
    verdict: dict[str, Any] = {"compiled": ref is not None, "correct": ref is not None}
    if ref is None:
        verdict["error"] = {"kind": "compile_error", "message": "error: bad flag"}
    else:
        estimate, low, high = ref
        verdict.update(
            speedup=estimate,
            runtime_ms=round(1.0 / estimate, 4),
            ref_runtime_ms=1.0,
            inputs_checked=3,
            interval={"estimate": estimate, "low": low, "high": high},
        )
    return {
        "event": "step",
        "step": n,
        "global": "compiler_flags",
        "local": local,
        "reason": "scripted",
        "status": "compile_error" if ref is None else "improved",
        "reward": 0.1,
        "speedup": None if ref is None else ref[0] / START_REF,
        "verdict": verdict,
        "replace": replace,
    }


def duel(speedup: float, low: float, high: float, confirmed: bool = True, against: int = 0) -> dict:
    """The `versus_best` of a step event: its duel in pairs against the best so far, the
    step `against` (0: the start)."""
    timed = {"speedup": speedup, "low": low, "high": high, "confirmed": confirmed}
    return {"versus_best": {**timed, "against": against}}


def result(best_step: int, best: float | None, bounds: tuple[float, float] | None) -> dict:
    low, high = bounds or (None, None)
    return {
        "event": "result",
        "run_id": "r",
        "task": "cpu_naive",
        "correct": True,
        "best_speedup": best,
        "ref_speedup": None if best is None else best * START_REF,
        "best_step": best_step,
        "stopped": "completed",
        "output_dir": "",
        "best_low": low,
        "best_high": high,
    }


async def offered_actions(
    client: LanguageClient, uri: str, where: t.Position
) -> list[t.CodeAction]:
    found = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri), t.Range(where, where), t.CodeActionContext([])
        )
    )
    return [a for a in found or [] if isinstance(a, t.CodeAction) and a.data]


async def hover_markdown(client: LanguageClient, uri: str, where: t.Position) -> str:
    hover = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), where)
    )
    assert hover is not None and isinstance(hover.contents, t.MarkupContent)
    return hover.contents.value
