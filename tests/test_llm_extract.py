"""Answer extraction on realistic LLM answers: code blocks and JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from htam_engine.llm.extract import (
    check_code,
    extract_candidate,
    extract_code,
    extract_json,
    fenced_blocks,
)

FIXTURES = Path(__file__).parent / "fixtures" / "llm"


def answer(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_chatter_around_the_block_is_dropped() -> None:
    code = extract_code(answer("answer_chatter.md"), "python")
    assert code is not None
    assert code.startswith("import torch")
    assert "class ModelNew" in code
    assert "Sure!" not in code and "Let me know" not in code


def test_several_blocks_pick_the_full_implementation() -> None:
    text = answer("answer_several_blocks.md")
    assert len(fenced_blocks(text)) == 3
    code = extract_code(text, "python")
    assert code is not None
    assert "def forward" in code and "load_cpp" in code
    assert "print(model(" not in code


def test_cuda_request_picks_the_cuda_block() -> None:
    code = extract_code(answer("answer_several_blocks.md"), "cuda")
    assert code is not None and "__global__" in code


def test_truncated_block_is_rejected() -> None:
    assert extract_code(answer("answer_truncated.md"), "python") is None


def test_unterminated_fence_accepted_when_it_parses() -> None:
    text = 'Here:\n```cpp\nextern "C" void f(float* x) { x[0] = 1.f; }\n'
    assert extract_code(text, "cpp") == 'extern "C" void f(float* x) { x[0] = 1.f; }\n'


def test_missing_fence_whole_text_that_parses() -> None:
    code = extract_code(answer("answer_cpp_unfenced.md"), "cpp")
    assert code is not None and code.startswith("#include <cstddef>")


def test_missing_fence_with_leading_prose() -> None:
    text = (
        "Here is the implementation.\nimport torch\n\nclass ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x\n"
    )
    code = extract_code(text, "python")
    assert code is not None and code.startswith("import torch")


@pytest.mark.parametrize(
    "text",
    [
        "I cannot help with that.",
        "",
        "```python\nx = (1,\n```",  # a syntax error inside a closed block
        "```python\nimport torch\n```",  # parses, but no ModelNew: not an implementation
        "```cuda\n__global__ void k(float* x) { x[0] = \n```",
        "```python\nclass ModelNew:\n    def forward(self, x):\n        return '\x00'\n```",
        "```python\nclass ModelNew:\n    def forward(self, x):\n        return "
        + "(" * 5000
        + ")" * 5000
        + "\n```",
    ],
)
def test_no_usable_code_gives_none(text: str) -> None:
    assert extract_code(text, "cuda" if "__global__" in text else "python") is None


def test_unknown_language_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="language must be one of"):
        extract_code("x", "rust")


def test_cuda_constructs_parse_cleanly() -> None:
    source = (
        "template <int B>\n"
        "__global__ void __launch_bounds__(256) k(const float* __restrict__ x) {\n"
        "  #pragma unroll\n  for (int i = 0; i < 4; ++i) { float4 v = ((const float4*)x)[i]; }\n}\n"
        'extern "C" void run(float* x) { k<256><<<1, 256>>>(x); }\n'
    )
    assert check_code(source, "cuda") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"local": "tiling", "reason": "reuse"}', {"local": "tiling", "reason": "reuse"}),
        (
            'I pick:\n```json\n{"local": "unroll", "reason": "fixed trip"}\n```\nDone.',
            {"local": "unroll", "reason": "fixed trip"},
        ),
        (
            'Answer: {"local": "a", "n": [1, 2]} and then more text {"other": 1}',
            {"local": "a", "n": [1, 2]},
        ),
        (
            "{'local': 'grid_stride', 'reason': \"it's simple\", 'ok': true,}",
            {"local": "grid_stride", "reason": "it's simple", "ok": True},
        ),
        (
            "{'local': 'x', 'score': -1.5, 'tags': ('a',), 'done': None}",
            {"local": "x", "score": -1.5, "tags": ["a"], "done": None},
        ),
    ],
)
def test_extract_json(text: str, expected: dict) -> None:
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text",
    ["no json here", "[1, 2, 3]", "{'a': __import__('os').getcwd()}", '{"a": 1', "{a: 1}"],
)
def test_extract_json_rejects(text: str) -> None:
    assert extract_json(text) is None


R1_ANSWER = """<think>
The user wants a faster softmax. A first draft, longer than the real answer because of
the comments I am still thinking through:
```python
import torch

class ModelNew(torch.nn.Module):
    # draft: maybe use a reduction first, maybe fuse the exponent, not sure yet, let me
    # think about it more, this is long on purpose
    def forward(self, x):
        return torch.softmax(x, dim=-1)  # calls the reference: not allowed
```
No, that calls torch. Let me write the kernel.
</think>
```python
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return my_kernel(x)
```"""


def test_reasoning_sections_are_not_the_answer() -> None:
    code = extract_code(R1_ANSWER, "python")
    assert code is not None and "my_kernel" in code and "torch.softmax" not in code


def test_an_answer_that_ran_out_while_thinking_has_no_code() -> None:
    cut = R1_ANSWER[: R1_ANSWER.index("No, that")]
    answer = extract_candidate(cut, "python", truncated=True)
    assert answer.code is None
    assert answer.reason == (
        "nothing but reasoning (<think>) (the answer was cut off at its max_tokens limit)"
    )
