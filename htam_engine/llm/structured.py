"""Structured choices: the schema a strategy choice must follow, and its parser.

The schema's enum holds only the runnable strategy ids, so a provider that constrains
its output (Anthropic tool use, OpenAI json_schema, llama.cpp's schema grammar) cannot
name anything else. For the looser forms (json_object, prompted JSON) the parser reads
every JSON object in the answer and takes the LAST one that names a runnable id: a model
that first echoes the prompt's template (`{"local": "<id>"}`) and then answers is read
by its answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from htam_engine.llm.base import JsonSchema
from htam_engine.llm.extract import object_at, without_reasoning

CHOICE_KEY = "local"
CHOICE_TOOL = "choose_strategy"


def choice_schema(runnable: Sequence[str]) -> JsonSchema:
    """A JSON object {"local": one of `runnable`, "reason": one line}."""
    if not runnable:
        raise ValueError("a choice needs at least one runnable strategy id")
    return JsonSchema(
        name=CHOICE_TOOL,
        description="Choose the next optimization strategy among the runnable candidates.",
        schema={
            "type": "object",
            "properties": {
                CHOICE_KEY: {"type": "string", "enum": list(runnable)},
                "reason": {"type": "string", "description": "one line: why this strategy, now"},
            },
            "required": [CHOICE_KEY, "reason"],
            "additionalProperties": False,
        },
    )


def bounded_strings(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A copy of `schema` in which every string without an enum, a pattern or a length
    bound gets `maxLength: max_chars` (for a grammar, which then must close the string;
    OpenAI's strict json_schema is sent the schema as it is)."""
    bounded = dict(schema)
    already = {"enum", "const", "pattern", "maxLength"} & set(bounded)
    if bounded.get("type") == "string" and not already:
        bounded["maxLength"] = max_chars
    for key in ("properties", "$defs", "definitions"):
        if isinstance(bounded.get(key), dict):
            bounded[key] = {k: bounded_strings(v, max_chars) for k, v in bounded[key].items()}
    if isinstance(bounded.get("items"), dict):
        bounded["items"] = bounded_strings(bounded["items"], max_chars)
    return bounded


@dataclass(frozen=True)
class Choice:
    """A runnable strategy id named by an answer, with its reason and the answer's form."""

    local_id: str
    reason: str
    form: str


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON(-like) object in `text` in order of position, nested ones included
    (fences need no special case: an object inside one is found at its position)."""
    for start in (match.start() for match in re.finditer(r"\{", text)):
        value = object_at(text, start)
        if value is not None:
            yield value


def named_id(value: dict[str, Any], runnable: Sequence[str]) -> str | None:
    """The runnable id an object names: under "local", else its only string value that
    is exactly a runnable id (models rename the key: "strategy", "id")."""
    named = value.get(CHOICE_KEY)
    if isinstance(named, str) and named.strip() in runnable:
        return named.strip()
    exact = {v.strip() for v in value.values() if isinstance(v, str) and v.strip() in runnable}
    return exact.pop() if len(exact) == 1 else None


def parse_choice(text: str, runnable: Sequence[str], form: str = "prompted") -> Choice | None:
    """The last JSON object in `text` (outside `<think>` sections) that names a
    runnable id, or None."""
    found: tuple[str, dict[str, Any]] | None = None
    for value in json_objects(without_reasoning(text)):
        local_id = named_id(value, runnable)
        if local_id is not None:
            found = (local_id, value)
    if found is None:
        return None
    local_id, value = found
    reason = value.get("reason")
    return Choice(local_id, reason.strip() if isinstance(reason, str) else "", form)
