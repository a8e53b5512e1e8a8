"""Prompt budget: tokens per step of HTAM's prompts vs. a flat-retrieval prompt.

    .venv/bin/python benchmarks/prompt_budget.py [--sizes 100 1000 10000] [--out FILE.json]

For each memory size N, N synthetic evidence entries are made from real code: the
mechanical rewrites (`htam_engine.strategies.REGISTRY`) applied to the examples' naive
kernels, each entry keeping a 400-character excerpt around the rewritten lines (the
store's EXCERPT_CHARS), with a strategy, task signature, status and speedup drawn from a
seeded RNG. Then:

- HTAM: the entries are applied to the cuda seed graph with `Graph.apply_outcome` (which
  keeps bounded evidence), and one step's prompts are built with the real builders,
  `local_selection_prompt` (state, chosen direction, its strategies) and
  `generation_prompt` (task, current code, feedback, the strategy with its best example
  and warnings). Reported: the mean over every direction / strategy as the chosen one.
- flat: the same generation prompt without a chosen strategy, followed by the retrieved
  entries: the top 10 by tag similarity to the task, or all N.

Tokens are counted with `htam_engine.llm.count_tokens` (tokenizer named in the output).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htam_engine.llm import count_tokens, generation_prompt, local_selection_prompt, tokenizer_name
from htam_engine.memory import EVIDENCE_BOUND, START, Graph, Outcome, load_seed
from htam_engine.memory.model import EXCERPT_CHARS
from htam_engine.policy import reward
from htam_engine.state import State
from htam_engine.strategies import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "softmax"
TOP_K = 10
CONTEXT_WINDOW = 200_000  # a large current model context, for the "fits?" column
STATUSES = ("improved", "not_improved", "compile_error", "incorrect", "timeout")
STATUS_WEIGHTS = (0.35, 0.25, 0.2, 0.15, 0.05)
TAGS = ("elementwise", "reduction", "matmul", "fused", "scalar_loads", "no_shared_memory", "loops")


@dataclass(frozen=True)
class Entry:
    local_id: str
    global_id: str
    signature: str
    tags: frozenset[str]
    status: str
    speedup: float | None
    excerpt: str

    def text(self) -> str:
        measured = f" {self.speedup:.2f}x" if self.speedup else ""
        return (
            f"- {self.local_id} ({self.global_id}) on {self.signature}: {self.status}{measured}\n"
            f"```\n{self.excerpt}\n```"
        )


def excerpts() -> list[str]:
    """Windows of real rewritten kernels around the first changed character."""
    out = []
    for path in sorted(ROOT.glob("examples/*/*_naive.py")):
        source = path.read_text()
        for rewrite in REGISTRY.values():
            if rewrite.check(source) is not None:
                continue
            new = rewrite.apply(source)
            i = next((k for k, (a, b) in enumerate(zip(source, new, strict=False)) if a != b), 0)
            start = max(0, i - EXCERPT_CHARS // 3)
            out.append(new[start : start + EXCERPT_CHARS])
    return out


def make_entries(graph: Graph, n: int, seed: int) -> list[Entry]:
    rng = random.Random(seed)
    pool, local_ids = excerpts(), list(graph.locals)
    entries = []
    for _ in range(n):
        lid = rng.choice(local_ids)
        status = rng.choices(STATUSES, STATUS_WEIGHTS)[0]
        tags = frozenset(rng.sample(TAGS, 3))
        speedup = None
        if status in ("improved", "not_improved"):
            speedup = rng.lognormvariate(0.3 if status == "improved" else -0.1, 0.3)
        entries.append(
            Entry(
                lid,
                graph.locals[lid].parent,
                f"cuda:{sorted(tags)[0]}:task{rng.randrange(n)}",
                tags,
                status,
                speedup,
                rng.choice(pool),
            )
        )
    return entries


def learn(graph: Graph, entries: list[Entry]) -> None:
    for e in entries:
        graph.apply_outcome(
            Outcome(
                backend=graph.backend,
                task_signature=e.signature,
                prefix=[START, START, START],
                alphas=[1 / 3] * 3,
                global_id=e.global_id,
                local_id=e.local_id,
                status=e.status,
                compiled=e.status != "compile_error",
                correct=e.speedup is not None,
                speedup=e.speedup,
                runtime_ms=None,
                reward=reward(e.status, e.speedup),
                code_excerpt=e.excerpt,
            )
        )


def _generation(local_text: str, positive: str | None, warnings: list[str]) -> str:
    system, prompt = generation_prompt(
        task_source=(EXAMPLE / "reference.py").read_text(),
        current_code=(EXAMPLE / "cuda_naive.py").read_text(),
        feedback="last step memory_access/coalesced_indexing: improved; speedup over start 1.31",
        local_text=local_text,
        positive_example=positive,
        negative_warnings=warnings,
        language="python",
    )
    return system + prompt


def htam_tokens(graph: Graph, state: State) -> dict[str, float]:
    local_sel = []
    for gid in graph.globals:
        system, prompt = local_selection_prompt(
            state.describe(),
            graph.globals[gid].prompt_text(),
            [(n.id, n.prompt_text()) for n in graph.locals_of(gid)],
        )
        local_sel.append(count_tokens(system + prompt))
    generation = [
        count_tokens(
            _generation(
                node.prompt_text(),
                node.evidence_positive[0].code_excerpt if node.evidence_positive else None,
                [e.note or e.code_excerpt for e in node.evidence_negative],
            )
        )
        for node in graph.locals.values()
    ]
    local_mean, gen_mean = statistics.fmean(local_sel), statistics.fmean(generation)
    return {"local_selection": local_mean, "generation": gen_mean, "total": local_mean + gen_mean}


def flat_tokens(entries: list[Entry], task_tags: frozenset[str], k: int | None) -> int:
    chosen = entries
    if k is not None:
        chosen = sorted(entries, key=lambda e: -len(e.tags & task_tags))[:k]
    base = _generation("Choose the most promising strategy from the retrieved memory.", None, [])
    retrieved = "\n## Retrieved memory (past attempts)\n" + "\n".join(e.text() for e in chosen)
    return count_tokens(base + retrieved)


def measure(sizes: list[int], seed: int) -> dict[str, Any]:
    state = State(
        "cuda",
        "reduction",
        "cuda:reduction:softmax",
        features={"scalar_loads", "no_shared_memory", "loops"},
        feedback={"improved"},
    )
    rows = []
    for n in sizes:
        graph = load_seed("cuda")
        entries = make_entries(graph, n, seed)
        learn(graph, entries)
        htam = htam_tokens(graph, state)
        flat_all = flat_tokens(entries, frozenset(state.tags()), None)
        rows.append(
            {
                "entries": n,
                "htam_local_selection": htam["local_selection"],
                "htam_generation": htam["generation"],
                "htam_total": htam["total"],
                "htam_kept_evidence": sum(
                    len(x.evidence_positive) + len(x.evidence_negative)
                    for x in graph.locals.values()
                ),
                "flat_top10": flat_tokens(entries, frozenset(state.tags()), TOP_K),
                "flat_all": flat_all,
                "flat_all_over_htam": flat_all / htam["total"],
                "flat_all_fits_context": flat_all <= CONTEXT_WINDOW,
            }
        )
    out = {"seed": seed, "tokenizer": tokenizer_name(), "evidence_bound": EVIDENCE_BOUND}
    out["rows"] = rows
    out["markdown"] = markdown(out)
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"Tokens per step ({out['tokenizer']}; seed {out['seed']}; HTAM = mean over directions "
        "and strategies).",
        "",
        "| evidence entries | HTAM local selection | HTAM generation | HTAM total | "
        f"kept evidence | flat top-{TOP_K} | flat all | flat all / HTAM | flat all fits 200k |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['entries']:,} | {r['htam_local_selection']:,.0f} | {r['htam_generation']:,.0f} "
            f"| {r['htam_total']:,.0f} | {r['htam_kept_evidence']} | {r['flat_top10']:,} | "
            f"{r['flat_all']:,} | {r['flat_all_over_htam']:.1f}x | "
            f"{'yes' if r['flat_all_fits_context'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("prompt_budget.json"), help="JSON output")
    args = parser.parse_args()
    if any(n < 1 for n in args.sizes):
        parser.error("--sizes must be positive")
    out = measure(args.sizes, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(out["markdown"])


if __name__ == "__main__":
    main()
