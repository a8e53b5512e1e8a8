"""Pull code and JSON out of LLM answers, robustly; None when there is nothing usable.

Code is accepted only if tree-sitter parses it without ERROR or MISSING nodes, so a
truncated or garbled answer becomes a "no code" outcome, never a compile attempt.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import tree_sitter_cuda
import tree_sitter_python
from tree_sitter import Language, Node, Parser

LANGUAGES = ("python", "cuda", "cpp")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)
# Fence info strings that name a language, mapped to ours.
_TAGS = {
    "python": "python", "py": "python", "python3": "python",
    "cuda": "cuda", "cu": "cuda", "cpp": "cpp", "c++": "cpp", "cxx": "cpp", "cc": "cpp",
    "c": "cpp", "h": "cpp", "hpp": "cpp",
}  # fmt: skip
# Top-level node types that show a text is a program, not prose that happens to parse.
_CODE_NODES = {
    "python": {
        "import_statement", "import_from_statement", "function_definition",
        "class_definition", "decorated_definition",
    },
    "cuda": {
        "function_definition", "preproc_include", "template_declaration",
        "linkage_specification", "namespace_definition", "declaration",
    },
}  # fmt: skip
_CODE_NODES["cpp"] = _CODE_NODES["cuda"]
# Where code starts in an unfenced answer that opens with prose.
_CODE_START = {
    "python": re.compile(r"^(import |from \w|class |def |@)", re.M),
    "cuda": re.compile(r"^(#include|#pragma|template\s*<|__global__|extern |namespace )", re.M),
}
_CODE_START["cpp"] = _CODE_START["cuda"]
_MODEL_NEW = re.compile(r"^class\s+ModelNew\b", re.M)


@dataclass(frozen=True)
class Block:
    tag: str
    code: str
    closed: bool


@cache
def _parser(language: str) -> Parser:
    grammar = tree_sitter_python if language == "python" else tree_sitter_cuda
    return Parser(Language(grammar.language()))


def parses(code: str, language: str) -> bool:
    """True if `code` parses with no ERROR/MISSING node and has a top-level definition."""
    root: Node = _parser(language).parse(code.encode("utf-8")).root_node
    if root.has_error:
        return False
    return any(child.type in _CODE_NODES[language] for child in root.children)


def fenced_blocks(text: str) -> list[Block]:
    """Fenced blocks in order; a last fence with no closing fence gives an open block."""
    blocks: list[Block] = []
    position = 0
    while match := _FENCE.search(text, position):
        fence, tag = match.group(1), match.group(2).lower()
        body_start = match.end() + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        end = closing.search(text, body_start)
        if end is None:
            blocks.append(Block(tag, text[body_start:], closed=False))
            break
        blocks.append(Block(tag, text[body_start : end.start()], closed=True))
        position = end.end()
    return blocks


def _score(block: Block, language: str) -> tuple[int, int, int]:
    """Higher is better: a full implementation, the right language tag, then length."""
    code = block.code
    if language == "python":
        full = int(_MODEL_NEW.search(code) is not None)
    else:
        full = int("__global__" in code) if language == "cuda" else int("{" in code)
    tag_match = int(_TAGS.get(block.tag) == language or (language == "cuda" and block.tag == "cpp"))
    return full, tag_match, len(code)


def extract_code(text: str, language: str) -> str | None:
    """The implementation in an LLM answer, or None (no block, truncated, or unparsable).

    Among several blocks the one that is a full implementation wins; Python code must
    define `ModelNew`. With no fence, the answer (or its part from the first line that
    starts code) counts if it parses.
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, not {language!r}")
    blocks = fenced_blocks(text)
    if blocks:
        ranked = sorted(blocks, key=lambda b: _score(b, language), reverse=True)
        candidates = [b.code for b in ranked]
    else:
        start = _CODE_START[language].search(text)
        candidates = [text] + ([text[start.start() :]] if start else [])
    for code in candidates:
        code = code.strip("\n")
        if _acceptable(code, language):
            return code + "\n"
    return None


def _acceptable(code: str, language: str) -> bool:
    if not code.strip() or not parses(code, language):
        return False
    return language != "python" or _MODEL_NEW.search(code) is not None


def extract_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: fenced, bare, or among prose; None if none.

    Python-style literals (single quotes, True/None, trailing commas) are accepted
    through a literal-only evaluator; nothing is ever executed.
    """
    fenced = [b.code for b in fenced_blocks(text) if b.closed]
    for candidate in [*fenced, text]:
        for start in (m.start() for m in re.finditer(r"\{", candidate)):
            value = _object_at(candidate, start)
            if value is not None:
                return value
    return None


def _object_at(text: str, start: int) -> dict[str, Any] | None:
    try:
        value, _end = json.JSONDecoder().raw_decode(text, start)
        return value if isinstance(value, dict) else None
    except ValueError:
        pass
    end = _balanced_end(text, start)
    if end is None:
        return None
    try:
        value = _literal(ast.parse(text[start:end], mode="eval").body)
    except (SyntaxError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _balanced_end(text: str, start: int) -> int | None:
    """Index after the `}` matching the `{` at `start`, skipping quoted strings."""
    depth, quote, escaped = 0, "", False
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    """Evaluate JSON-like literals only (dicts, lists, strings, numbers, true/null)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _literal(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        keys = [_literal(key) for key in node.keys if key is not None]
        if all(isinstance(key, str) for key in keys):
            return dict(zip(keys, (_literal(v) for v in node.values), strict=True))
    raise ValueError(f"not a JSON-like literal: {ast.dump(node)[:80]}")
