"""make_provider: what `--provider auto` picks, and the one line that says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from htam_engine.llm import (
    DEFAULT_MODELS,
    AnthropicProvider,
    LLMError,
    OpenAIProvider,
    Recorder,
    ReplayProvider,
    make_provider,
)


@pytest.fixture
def cassette(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "recorded"}\n')
    return path


def test_auto_without_anything_is_offline() -> None:
    provider, line = make_provider("auto", env={})
    assert provider is None
    assert line == "offline: mechanical strategies only (no API key or base URL in the environment)"


def test_auto_prefers_anthropic_key() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-ant-abcdefgh12345678", "OPENAI_API_KEY": "sk-x"}
    provider, line = make_provider("auto", env=env)
    assert isinstance(provider, AnthropicProvider)
    assert provider.model == DEFAULT_MODELS["anthropic"]
    assert line == f"anthropic {DEFAULT_MODELS['anthropic']} (ANTHROPIC_API_KEY is set)"
    assert "sk-ant" not in line


def test_auto_openai_key_and_model_override() -> None:
    provider, line = make_provider(
        "auto", env={"OPENAI_API_KEY": "sk-abcdefghijklmnopqrst", "HTAM_LLM_MODEL": "gpt-4.1"}
    )
    assert isinstance(provider, OpenAIProvider) and provider.model == "gpt-4.1"
    assert line == "openai gpt-4.1 (OPENAI_API_KEY is set)"


def test_auto_base_url_means_a_compatible_server_without_key() -> None:
    env = {"HTAM_LLM_BASE_URL": "http://user:pw@localhost:8000/v1", "HTAM_LLM_MODEL": "qwen"}
    provider, line = make_provider("auto", env=env)
    assert isinstance(provider, OpenAIProvider)
    assert provider.base_url == env["HTAM_LLM_BASE_URL"]
    assert line == "openai qwen at http://localhost:8000/v1 (HTAM_LLM_BASE_URL is set)"
    assert "pw" not in line


def test_auto_cassette_from_environment(cassette: Path) -> None:
    provider, line = make_provider("auto", env={"HTAM_CASSETTE": str(cassette)})
    assert isinstance(provider, ReplayProvider)
    assert line == f"replay from {cassette} (HTAM_CASSETTE is set)"
    assert provider.complete("s", "p").text == "recorded"


def test_explicit_model_and_recording(tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    provider, line = make_provider(
        "openai", model="deepseek-chat", base_url="http://127.0.0.1:9/v1", record=record, env={}
    )
    assert isinstance(provider, Recorder) and provider.model == "deepseek-chat"
    assert line.endswith(f"(--provider openai); recording to {record}")


def test_offline_explicit() -> None:
    assert make_provider("offline", env={"ANTHROPIC_API_KEY": "x"}) == (
        None,
        "offline: mechanical strategies only (--provider offline)",
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gemini", "unknown provider 'gemini'"),
        ("anthropic", "needs ANTHROPIC_API_KEY"),
        ("openai", "needs OPENAI_API_KEY, or a base URL"),
        ("replay", "needs a cassette"),
    ],
)
def test_misconfiguration_is_a_clear_error(name: str, message: str) -> None:
    with pytest.raises(LLMError, match=message):
        make_provider(name, env={})


def test_provider_choice_loads_no_sdk() -> None:
    """The language server asks which provider would run without paying for the SDKs."""
    code = (
        "import sys, htam_engine.llm.choice as c\n"
        "print(c.choose_provider(None, None, {})[0])\n"
        "print(sorted({'anthropic', 'openai', 'tiktoken'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["offline", "[]"]
