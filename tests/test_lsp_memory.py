"""Suggestions live in the shared memory store: a fresh server process offers, resolves,
applies and explains a candidate that another process recorded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import pytest_lsp
from fixtures.lsp.lspkit import (
    CLIENTS,
    FIXTURES,
    HOME,
    apply_edits,
    find,
    open_file,
    server_config,
)
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

from htam_engine.memory import MemoryStore, load_seed
from htam_engine.policy import PolicyConfig, make_prefix, select_global
from htam_engine.state import State
from htam_lsp import suggestions as sg

LOCAL = "smem_tiling"  # an LLM-written (non-mechanical) strategy of the CUDA seed


@pytest_lsp.fixture(config=server_config(), params=CLIENTS)
async def client(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    lsp_client.spec = request.param  # type: ignore[attr-defined]
    yield lsp_client
    await lsp_client.shutdown_session()


def record_step(uri: str, text: str, candidate: str) -> str:
    """Store one verified 1.84x step for `uri`'s kernel, as the server would; its global."""
    graph = load_seed("cuda")
    state = State("cuda", "elementwise", "cuda:elementwise:scale", {"no_shared_memory"})
    config = PolicyConfig()
    decision = select_global(graph, make_prefix([], config.K), state, config, random.Random(0))
    parent = graph.locals[LOCAL].parent
    event = {
        "step": 1,
        "global": parent,
        "local": LOCAL,
        "reason": "each input element is loaded by several threads",
        "status": "improved",
        "speedup": 1.84,
        "decision": {**decision.to_json(), "chosen": parent},
        "local_decision": {"local_id": LOCAL, "reason": "reuse", "ranking": []},
        "verdict": {"compiled": True, "correct": True, "speedup": 2.5, "inputs_checked": 3},
        "source": candidate,
    }
    step = sg.trim_step(event, sg.text_hash(text.encode()), 1)
    MemoryStore(Path(HOME)).put(sg.NAMESPACE, sg.record_key(uri, "scale"), sg.add_step(None, step))
    return parent


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
    parent = record_step(path.as_uri(), text, candidate)
    uri = open_file(client, path, "cuda")
    where = find(text, "scale(", encoding)

    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            t.TextDocumentIdentifier(uri), t.Range(where, where), t.CodeActionContext([])
        )
    )
    offered = [
        a
        for a in actions or []
        if isinstance(a, t.CodeAction) and a.kind == f"refactor.rewrite.htam.{LOCAL}"
    ]
    assert len(offered) == 1
    action = offered[0]
    assert action.title.endswith("(1.84x measured, correct on 3 inputs)")
    assert action.is_preferred and list(action.tags or []) == [t.CodeActionTag.LlmGenerated]
    resolved = await client.code_action_resolve_async(action)
    applied = apply_edits(text, list(resolved.edit.changes[uri]), encoding)  # type: ignore[union-attr, index]
    assert applied == candidate

    lenses = await client.text_document_code_lens_async(
        t.CodeLensParams(t.TextDocumentIdentifier(uri))
    )
    titles = [lens.command.title for lens in lenses or [] if lens.command]
    assert any(title.startswith("Best: 1.84x measured (") for title in titles)

    hover = await client.text_document_hover_async(
        t.HoverParams(t.TextDocumentIdentifier(uri), where)
    )
    assert hover is not None and isinstance(hover.contents, t.MarkupContent)
    markdown = hover.contents.value
    name = load_seed("cuda").globals[parent].name
    assert f"**{name}** (chosen)" in markdown
    assert "each input element is loaded by several threads" in markdown  # the local reason
    assert "Risks:" in markdown and "Checks:" in markdown and "| 1.84x |" in markdown
    assert "+        y[i] = x[i] + x[i];  // 𝛼 tiled" in markdown  # the diff of the suggestion
