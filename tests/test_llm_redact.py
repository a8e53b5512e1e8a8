"""The redaction helper: keys are masked, ordinary code and prose are left alone."""

from __future__ import annotations

from htam_engine.llm import redact, register_secret
from htam_engine.llm.base import REDACTED


def test_registered_and_given_secrets_are_masked() -> None:
    register_secret("local-server-token-42")
    text = "token=local-server-token-42 and extra=hunter2hunter2"
    assert redact(text, ["hunter2hunter2"]) == f"token={REDACTED} and extra={REDACTED}"


def test_key_shapes_are_masked_without_registration() -> None:
    text = (
        "anthropic sk-ant-api03-AbCdEf0123456789xyz openai sk-proj-0123456789abcdefXYZ "
        "header Authorization: Bearer abcdef0123456789ABCDEF x-api-key: 'k3y-0123456789'"
    )
    masked = redact(text)
    for secret in ("AbCdEf0123456789", "0123456789abcdefXYZ", "abcdef0123456789ABCDEF", "k3y-01"):
        assert secret not in masked
    assert masked.count(REDACTED) == 4
    assert "Bearer " in masked and "x-api-key: '" in masked


def test_code_and_prose_are_untouched() -> None:
    text = (
        "task-specific-optimization-tips; float mask-based_selection_of_elements = 0;\n"
        "__global__ void k(const float* __restrict__ x) { int disk-usage-by-thread-block; }\n"
        "a bearer of good news"
    )
    assert redact(text) == text


def test_a_local_servers_placeholder_key_is_no_secret_to_mask_in_prose() -> None:
    """`OPENAI_API_KEY=none` for a local server: recorded prompts kept saying "allowed
    ops: [REDACTED]" (and a model named "frontier-bridge" read "frontier-[REDACTED]")."""
    register_secret("none")
    register_secret("bridge")
    text = "allowed ops: none; model frontier-bridge"
    assert redact(text) == text
