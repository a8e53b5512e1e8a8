"""Pull code and JSON out of LLM answers, robustly; None when there is nothing usable.

Code is accepted only if it parses (Python's own parser; tree-sitter with no ERROR or
MISSING node for CUDA/C++) and defines what the evaluator will call, so a truncated or
garbled answer becomes a "no code" outcome with its reason, never a compile attempt.
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
# R1-style models served locally (llama.cpp, Ollama, vLLM) put their chain of thought in
# the answer; drafts in it are not the answer.
_THINK = re.compile(r"<think>.*?</think>", re.S)


@dataclass(frozen=True)
class Block:
    tag: str
    code: str
    closed: bool


@cache
def _parser(language: str) -> Parser:
    grammar = tree_sitter_python if language == "python" else tree_sitter_cuda
    return Parser(Language(grammar.language()))


def without_reasoning(text: str) -> str:
    """`text` without `<think>...</think>` sections; an unclosed one (the answer ran out
    while thinking) drops everything after it."""
    text = _THINK.sub("", text)
    unclosed = text.find("<think>")
    return text[:unclosed] if unclosed >= 0 else text


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


@dataclass(frozen=True)
class CodeAnswer:
    """The usable code of an answer, or None and the reason it cannot be compiled."""

    code: str | None
    reason: str = ""

    def to_json(self) -> dict[str, str | None]:
        return {"code": self.code, "reason": self.reason}


def extract_candidate(
    text: str, language: str, *, entry: str | None = None, truncated: bool = False
) -> CodeAnswer:
    """The implementation in an LLM answer, or why there is none (for a `no_code` step).

    Among several blocks the one that is a full implementation wins. With no fence, the
    answer (or its part from the first line that starts code) counts. Code is usable
    only if `check_code` accepts it: it parses, in the right language, and defines
    `ModelNew.forward` (Python) or the bound `entry` function (CUDA/C++).
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, not {language!r}")
    if not text.strip():
        return CodeAnswer(None, "empty answer")
    text = without_reasoning(text)
    if not text.strip():
        return CodeAnswer(None, _truncated("nothing but reasoning (<think>)", truncated))
    blocks = fenced_blocks(text)
    if blocks:
        ranked = sorted(blocks, key=lambda b: _score(b, language), reverse=True)
        candidates = [b.code for b in ranked]
    else:
        start = _CODE_START[language].search(text)
        if start is None:
            return CodeAnswer(None, _truncated("no code in the answer", truncated))
        candidates = [text, text[start.start() :]]
    reasons = []
    for code in candidates:
        code = code.strip("\n")
        reason = check_code(code, language, entry)
        if reason is None:
            return CodeAnswer(code + "\n")
        reasons.append(reason)
    reason = reasons[0] if blocks else f"no code block; {reasons[-1]}"
    wrong = _other_language(blocks, language)
    if wrong:
        reason = f"the answer is {wrong} code, not {language}; {reason}"
    return CodeAnswer(None, _truncated(reason, truncated))


def _truncated(reason: str, truncated: bool) -> str:
    return reason + (" (the answer was cut off at its max_tokens limit)" if truncated else "")


def extract_code(text: str, language: str, entry: str | None = None) -> str | None:
    """`extract_candidate(...).code`: the usable implementation, or None."""
    return extract_candidate(text, language, entry=entry).code


def _other_language(blocks: list[Block], language: str) -> str | None:
    """The one other language every tagged block is in, if the answer has no block of ours."""
    tags = {_TAGS[b.tag] for b in blocks if b.tag in _TAGS}
    compatible = {"cuda", "cpp"} if language != "python" else {"python"}
    return tags.pop() if len(tags) == 1 and not tags & compatible else None


def check_code(code: str, language: str, entry: str | None = None) -> str | None:
    """None when `code` can be compiled as `language`, else the reason it cannot."""
    if not code.strip():
        return "empty code block"
    if language == "python":
        return _check_python(code)
    root: Node = _parser(language).parse(code.encode("utf-8")).root_node
    if root.has_error:
        return f"{language} does not parse (first error at line {_first_error_line(root)})"
    if not any(child.type in _CODE_NODES[language] for child in root.children):
        return f"no {language} definitions (prose, not a program)"
    if entry is not None and entry not in _function_names(root):
        return f"no function {entry} (the bound entry the reference calls)"
    if entry is None and language == "cuda" and "__global__" not in code:
        return "no __global__ kernel"
    return None


def _check_python(code: str) -> str | None:
    try:
        module = ast.parse(code)
    except SyntaxError as error:
        return f"Python does not parse (line {error.lineno}: {error.msg})"
    classes = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    if not classes:
        return "no top-level class ModelNew"
    methods = {n.name for n in classes[-1].body if isinstance(n, ast.FunctionDef)}
    return None if "forward" in methods else "ModelNew has no forward method"


def _first_error_line(root: Node) -> int:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return node.start_point[0] + 1
        stack.extend(reversed([child for child in node.children if child.has_error]))
    return root.start_point[0] + 1


def _function_names(root: Node) -> set[str]:
    """Names of every function defined anywhere (inside extern "C", namespaces too)."""
    names = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            declarator = node.child_by_field_name("declarator")
            while declarator is not None and declarator.type != "function_declarator":
                declarator = declarator.child_by_field_name("declarator")
            name = declarator.child_by_field_name("declarator") if declarator else None
            if name is not None and name.text is not None:
                names.add(name.text.decode("utf-8").split("::")[-1])
        stack.extend(node.children)
    return names


def extract_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: fenced, bare, or among prose; None if none.

    Python-style literals (single quotes, True/None, trailing commas) are accepted
    through a literal-only evaluator; nothing is ever executed.
    """
    fenced = [b.code for b in fenced_blocks(text) if b.closed]
    for candidate in [*fenced, text]:
        for start in (m.start() for m in re.finditer(r"\{", candidate)):
            value = object_at(candidate, start)
            if value is not None:
                return value
    return None


def object_at(text: str, start: int) -> dict[str, Any] | None:
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
