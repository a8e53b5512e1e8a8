"""Mechanical Triton rewrites: where each applies, what it refuses and why, and that every
rewritten example is still correct when Triton's interpreter runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.examples import EXAMPLES
from helpers.triton import TRITON_IDS, TRITON_TASKS, chain, run_candidates

from htam_engine import parsing
from htam_engine.strategies import REGISTRY, NotApplicable

TASKS = TRITON_TASKS
# Rewrites that apply to only some examples; every other one applies to all three.
ONLY = {"triton.num_stages": {"matmul"}, "triton.group_m": {"matmul"}}
TAG_AFTER = {
    "triton.num_warps": "num_warps_set",
    "triton.num_stages": "num_stages_set",
    "triton.autotune": "autotune",
    "triton.group_m": "grouped_ordering",
}


def example(task: str) -> str:
    return (EXAMPLES / task / "triton_naive.py").read_text()


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("rid", TRITON_IDS)
def test_rewrite_on_triton_example(rid: str, task: str) -> None:
    rewrite, source = REGISTRY[rid], example(task)
    assert rewrite.backend == "triton"
    reason = rewrite.check(source)
    if task not in ONLY.get(rid, set(TASKS)):
        assert isinstance(reason, str) and reason
        with pytest.raises(NotApplicable, match=rid):
            rewrite.apply(source)
        return
    assert reason is None
    out = rewrite.apply(source)
    assert out != source and not parsing.has_errors(out, "python")
    assert rewrite.apply(source) == out
    tag = TAG_AFTER.get(rid)
    if tag is not None:
        assert tag in parsing.features(out, "triton") - parsing.features(source, "triton")


def test_rewrites_refuse_what_they_cannot_do_correctly() -> None:
    gelu = example("gelu")
    literal = gelu.replace('lambda meta: (triton.cdiv(n, meta["BLOCK"]),)', "(n + 1023) // 1024,")
    assert "hard-codes BLOCK=1024" in (REGISTRY["triton.block_size"].check(literal) or "")
    assert "hard-codes BLOCK=1024" in (REGISTRY["triton.autotune"].check(literal) or "")
    tuned = REGISTRY["triton.autotune"].apply(gelu)
    for rid in ("triton.autotune", "triton.block_size", "triton.num_warps"):
        assert "autotune" in (REGISTRY[rid].check(tuned) or ""), rid
    warped = REGISTRY["triton.num_warps"].apply(gelu)
    assert "already sets num_warps" in (REGISTRY["triton.num_warps"].check(warped) or "")
    grouped = REGISTRY["triton.group_m"].apply(example("matmul"))
    assert "already grouped" in (REGISTRY["triton.group_m"].check(grouped) or "")
    unlaunched = gelu.split("class ModelNew")[0]
    assert "no kernel[grid](...) launch" in (REGISTRY["triton.num_warps"].check(unlaunched) or "")
    assert "no @triton.jit kernel" in (REGISTRY["triton.num_warps"].check("x = 1\n") or "")


def test_block_sizes_double_until_the_tile_limit() -> None:
    source = example("gelu")
    sizes = []
    while REGISTRY["triton.block_size"].check(source) is None:
        source = REGISTRY["triton.block_size"].apply(source)
        sizes.append(int(source.split("BLOCK=")[-1].split(")")[0]))
    assert sizes == [2048, 4096, 8192]
    assert "size limit" in (REGISTRY["triton.block_size"].check(source) or "")
    matmul = REGISTRY["triton.block_size"].apply(example("matmul"))
    assert "BLOCK_M=128, BLOCK_N=128, BLOCK_K=32" in matmul


@pytest.mark.parametrize("task", TASKS)
def test_every_rewritten_example_is_correct_under_the_interpreter(
    task: str, tmp_path: Path
) -> None:
    sources = {"naive": example(task), "chain": chain(example(task))}
    for rid in TRITON_IDS:
        if REGISTRY[rid].check(example(task)) is None:
            sources[rid] = REGISTRY[rid].apply(example(task))
    errors = run_candidates(task, sources, tmp_path)
    assert set(errors) == set(sources)
    assert all(error < 1e-4 for error in errors.values()), errors
