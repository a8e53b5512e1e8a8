"""Suggestions live in the shared memory store: a fresh server process offers, resolves,
applies and explains a candidate that another process recorded."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import pytest
import pytest_lsp
from helpers.lsp import (
    CLIENTS,
    FIXTURES,
    annotated,
    apply_edits,
    edits_of,
    find,
    open_file,
    server_config,
)
from helpers.scripted_engine import hover_markdown, offered_actions
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

from htam_engine import events
from htam_engine.decisions import LocalDecision
from htam_engine.evaluate.verdict import Duel, Verdict
from htam_engine.memory import load_seed
from htam_engine.policy import PolicyConfig, make_prefix, select_global
from htam_engine.state import State
from htam_lsp import suggestions as sg

LOCAL = "smem_tiling"  # an LLM-written (non-mechanical) strategy of the CUDA seed


@pytest_lsp.fixture(config=server_config(), params=CLIENTS)
async def client(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    lsp_client.spec = request.param  # type: ignore[attr-defined]
    yield lsp_client
    await lsp_client.shutdown_session()


def step_event(global_id: str, local: str, speedup: float, source: str) -> events.Step:
    """A verified step as `htam optimize --events` reports it (0.5 ms; PyTorch 1.25 ms),
    with its duel against the start in pairs (95 % +-0.09): confirmed if over 1.02x."""
    graph = load_seed("cuda")
    low = round(speedup - 0.09, 2)
    # a matmul state: the policy offers shared-memory tiling (LOCAL) only where it fits
    state = State("cuda", "matmul", "cuda:matmul:scale", {"no_shared_memory"})
    config = PolicyConfig()
    decision = select_global(graph, make_prefix([], config.K), state, config, random.Random(0))
    verdict = Verdict(
        compiled=True,
        correct=True,
        speedup=2.5,
        runtime_ms=0.5,
        ref_runtime_ms=1.25,
        inputs_checked=3,
    )
    return events.Step(
        step=1,
        global_id=global_id,
        local_id=local,
        reason="each input element is loaded by several threads",
        status="improved",
        reward=0.6,
        speedup=speedup,
        decision=dataclasses.replace(decision, chosen=global_id),
        local_decision=LocalDecision(local, "reuse"),
        verdict=verdict,
        source=source,
        versus_best=Duel(speedup, low, speedup + 0.09, confirmed=low >= 1.02),
    )


def record_steps(uri: str, text: str, steps: list[events.Step]) -> None:
    """Store steps for `uri` as another server process would have."""
    store = sg.SuggestionStore(Path(os.environ["HTAM_HOME"]))  # the server's, this test's
    for step in steps:
        store.add(uri, step, sg.anchor(text, step.source, [])).result()


def _change(client: LanguageClient, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(
        t.DidChangeTextDocumentParams(
            t.VersionedTextDocumentIdentifier(version=version, uri=uri),
            [t.TextDocumentContentChangeWholeDocument(text)],
        )
    )


async def test_recorded_suggestion_survives_into_a_new_server(
    client: LanguageClient, tmp_path: Path
):
    spec = client.spec  # type: ignore[attr-defined]
    caps = client_capabilities(spec)
    code_action = caps.text_document.code_action  # type: ignore[union-attr]
    code_action.tag_support = t.CodeActionTagOptions([t.CodeActionTag.LlmGenerated])  # type: ignore[union-attr]
    result = await client.initialize_session(t.InitializeParams(capabilities=caps))
    encoding = str(result.capabilities.position_encoding or "utf-16")

    path = tmp_path / "scale.cu"
    text = (FIXTURES / "cuda" / "scale_bound.cu").read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    candidate = text.replace("y[i] = 2.0f * x[i];", "y[i] = x[i] + x[i];  // 𝛼 tiled")
    parent = load_seed("cuda").locals[LOCAL].parent
    slower = text.replace("int i =", "const int i =")
    record_steps(
        path.as_uri(),
        text,
        [
            step_event(parent, LOCAL, 1.84, candidate),
            step_event(parent, "read_only_ldg", 1.05, slower),
        ],
    )
    uri = open_file(client, path, "cuda")
    where = find(text, "scale(", encoding)

    offered = await offered_actions(client, uri, where)
    assert [a.kind for a in offered] == [f"refactor.rewrite.htam.{LOCAL}"]  # 1.05x is no win
    action = offered[0]
    assert action.title.endswith(": 1.84x faster (95 % 1.75-1.93)"), action.title
    assert action.data["speedup"] == 1.84 and action.data["refMs"] == 1.25  # type: ignore[index]
    assert action.is_preferred and list(action.tags or []) == [t.CodeActionTag.LlmGenerated]
    resolved = await client.code_action_resolve_async(action)
    assert apply_edits(text, edits_of(resolved.edit, uri), encoding) == candidate
    # VS Code labels it for its refactor preview; Neovim gets plain changes.
    assert annotated(resolved.edit) == (spec == "visual-studio-code")

    lenses = await client.text_document_code_lens_async(
        t.CodeLensParams(t.TextDocumentIdentifier(uri))
    )
    titles = [lens.command.title for lens in lenses or [] if lens.command]
    assert [t for t in titles if t.startswith("Best: ")] == [
        "Best: 1.84x faster than your code (95 % 1.75-1.93; 0.92 -> 0.5 ms; PyTorch 1.25 ms) "
        f"({load_seed('cuda').globals[parent].name} -> {load_seed('cuda').locals[LOCAL].name})"
    ]  # one per file: a step optimizes the whole file

    markdown = await hover_markdown(client, uri, where)
    name = load_seed("cuda").globals[parent].name
    assert f"**{name}** (chosen)" in markdown
    assert "each input element is loaded by several threads" in markdown  # the local reason
    assert (
        "Risks:" in markdown and "Checks:" in markdown and "| 1.84x (95 % 1.75-1.93) |" in markdown
    )
    assert "+        y[i] = x[i] + x[i];  // 𝛼 tiled" in markdown  # the diff of the suggestion

    shown = await client.workspace_execute_command_async(
        t.ExecuteCommandParams("htam.results", [{"uri": uri, "position": _json(where)}])
    )
    assert (
        shown is not None
        and "2 step(s), 2 correct; best 1.84x (95 % 1.75-1.93)" in shown["markdown"]
    )
    assert "| 1.05x (95 % 0.96-1.14) |" in shown["markdown"]  # measured, shown, not offered
    assert [(s["line"], s["speedup"]) for s in shown["suggestions"]] == [(4, 1.84)]
    assert shown["suggestions"][0]["title"] == action.title

    # An edit elsewhere in the file keeps the suggestion, and the old action still resolves.
    edited = text.replace("void scale_launch(", "// launcher\nvoid scale_launch(")
    _change(client, uri, 2, edited)
    resolved = await client.code_action_resolve_async(action)
    expected = candidate.replace("void scale_launch(", "// launcher\nvoid scale_launch(")
    assert apply_edits(edited, edits_of(resolved.edit, uri), encoding) == expected
    assert len(await offered_actions(client, uri, where)) == 1

    # An edit of the kernel itself drops it, and the hover says why.
    _change(client, uri, 3, edited.replace("if (i < n)", "if (i < n && n > 0)"))
    assert await offered_actions(client, uri, where) == []
    assert "no longer apply: the kernel's text changed" in await hover_markdown(client, uri, where)


def _json(position: t.Position) -> dict[str, int]:
    return {"line": position.line, "character": position.character}
