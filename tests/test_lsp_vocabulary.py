"""The editors read the shared words from generated files and the VS Code manifest: both
must say what htam_engine.vocabulary says."""

from __future__ import annotations

import json
from pathlib import Path

from htam_engine.vocabulary import MAX_STEPS, MIN_STEPS, PROVIDERS, kind_of
from htam_lsp import client_vocabulary

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_client_constants_match_the_vocabulary():
    for path, text in client_vocabulary.files().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is stale: run python -m htam_lsp.client_vocabulary"
        )


def test_the_vscode_settings_bounds_are_the_vocabularys():
    manifest = json.loads((ROOT / "editors/vscode/package.json").read_text(encoding="utf-8"))
    settings = manifest["contributes"]["configuration"]["properties"]
    steps = settings["htam.steps"]
    assert (steps["minimum"], steps["maximum"]) == (MIN_STEPS, MAX_STEPS)
    assert MIN_STEPS <= steps["default"] <= MAX_STEPS
    provider = settings["htam.provider"]
    assert tuple(provider["enum"]) == PROVIDERS
    assert len(provider["enumDescriptions"]) == len(PROVIDERS)


def test_kind_of_a_path():
    assert kind_of("k.cu") == kind_of(Path("a/k.cuh")) == "cu"
    assert kind_of("model_new.py") == kind_of("kernel.cpp") == kind_of("noext") == "py"
