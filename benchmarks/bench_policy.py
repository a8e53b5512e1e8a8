"""Cost of one selection + update as the memory grows: HTAM's HTG vs. flat retrieval.

    .venv/bin/python benchmarks/bench_policy.py [--sizes 100 1000 10000 100000] [--out FILE]

For each size N, N synthetic outcomes (random directions, strategies, tasks and statuses
of the cuda seed) are fed to both memories:

- HTAM: the HTG keeps statistics per node and edge and bounded evidence per strategy, so
  one step (the loop's `Episode.decide` and `finish` + Graph.apply_outcome) touches
  a fixed number of nodes. "HTAM (store)" is the same step against the real SQLite store
  (graph load, selection, one fsynced transaction) after importing that learned state.
- flat: every outcome is one entry in a list; a step scores every entry against the
  current state (tag overlap + measured gain), takes the top 5, and appends the result.

Times are medians over --repeats steps, in microseconds. Prints a Markdown table and
writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from htam_engine.episode import Episode
from htam_engine.memory import START, Graph, MemoryStore, Outcome, load_seed
from htam_engine.memory.store import EXPORT_FORMAT, SCHEMA_VERSION, learned_rows
from htam_engine.policy import EvidenceLocalSelector
from htam_engine.state import PathEntry, State
from htam_engine.vocabulary import Status

TAGS = [
    "scalar_loads",
    "no_restrict",
    "loops",
    "nested_loops",
    "shared_memory",
    "reduction",
    "matmul",
    "elementwise",
    "no_grid_stride",
    "fixed_trip_loop",
    "atomics",
    "half_precision",
]


@dataclass
class FlatEntry:
    tags: frozenset[str]
    local_id: str
    status: str
    speedup: float
    excerpt: str


def synthetic_outcome(graph: Graph, rng: random.Random) -> tuple[Outcome, frozenset[str]]:
    local = rng.choice(list(graph.locals.values()))
    status = rng.choice(list(Status))
    speedup = rng.uniform(0.5, 3.0)
    reward = math.log(speedup) if status in ("improved", "not_improved") else -0.5
    prefix = [START, rng.choice(list(graph.globals))]
    outcome = Outcome(
        "cuda",
        f"cuda:op{rng.randrange(500)}:f32",
        prefix,
        [0.35, 0.65],
        local.parent,
        local.id,
        status,
        True,
        status in ("improved", "not_improved"),
        speedup,
        1.0,
        reward,
        "__global__ void k(...) { ... }",
    )
    return outcome, frozenset(rng.sample(TAGS, 4))


def build(size: int, seed: int) -> tuple[Graph, list[FlatEntry]]:
    rng = random.Random(seed)
    graph, flat = load_seed("cuda"), []
    for _ in range(size):
        outcome, tags = synthetic_outcome(graph, rng)
        graph.apply_outcome(outcome)
        flat.append(
            FlatEntry(
                tags, outcome.local_id, outcome.status, outcome.speedup or 1.0, outcome.code_excerpt
            )
        )
    return graph, flat


def query_episode() -> Episode:
    """A run one step in, after an improving vectorization step."""
    path = [PathEntry("memory_access", "vectorized_float4", Status.IMPROVED)]
    return Episode("cuda", "elementwise", "cuda:relu:f32[1M]", path=path)


def query_state() -> State:
    return query_episode().state(
        {"scalar_loads", "no_restrict"}, last_speedup=1.4, best_speedup=1.4
    )


def select_and_outcome(graph: Graph, state: State, rng: random.Random) -> Outcome:
    """One step of the loop's own core: decide, then learn a (fixed, improving) outcome."""
    episode = query_episode()
    decision = episode.decide(graph, state, rng, EvidenceLocalSelector())
    return episode.finish(
        decision, Status.IMPROVED, speedup=1.2, runtime_ms=0.8, code_excerpt="code"
    )


def htam_step(graph: Graph, state: State, rng: random.Random) -> None:
    graph.apply_outcome(select_and_outcome(graph, state, rng))


def store_step(store: MemoryStore, state: State, rng: random.Random) -> None:
    store.apply_outcome(select_and_outcome(store.graph("cuda"), state, rng))


def flat_step(entries: list[FlatEntry], state: State) -> None:
    tags = frozenset(state.tags())

    def score(entry: FlatEntry) -> float:
        overlap = len(entry.tags & tags) / len(entry.tags | tags)
        gain = math.log(entry.speedup) if entry.status == "improved" else -0.5
        return overlap + 0.2 * gain

    top = heapq.nlargest(5, entries, key=score)
    entries.append(FlatEntry(tags, top[0].local_id, "improved", 1.2, "code"))


def median_us(step: Callable[[], None], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def measure(size: int, repeats: int, seed: int) -> dict[str, float | int]:
    graph, flat = build(size, seed)
    state, rng = query_state(), random.Random(seed)
    kept = sum(len(n.evidence_positive) + len(n.evidence_negative) for n in graph.locals.values())
    with tempfile.TemporaryDirectory() as home:
        snapshot = Path(home) / "learned.json"
        snapshot.write_text(
            json.dumps(
                {
                    "format": EXPORT_FORMAT,
                    "schema_version": SCHEMA_VERSION,
                    "learned": learned_rows(graph),
                    "kv": [],
                }
            )
        )
        with MemoryStore(Path(home) / "store") as store:
            store.import_json(snapshot)
            store_us = median_us(lambda: store_step(store, state, rng), repeats)
    return {
        "entries": size,
        "htam_kept_evidence": kept,
        "htam_us": median_us(lambda: htam_step(graph, state, rng), repeats),
        "htam_store_us": store_us,
        "flat_us": median_us(lambda: flat_step(flat, state), repeats),
    }


def markdown(rows: list[dict[str, float | int]]) -> str:
    lines = [
        "| evidence entries | HTAM step (us) | HTAM step with store (us) "
        "| flat retrieval step (us) | evidence HTAM keeps |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['entries']:,} | {r['htam_us']:.0f} | {r['htam_store_us']:.0f} "
            f"| {r['flat_us']:.0f} | {r['htam_kept_evidence']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=30, help="steps timed per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench_policy.json"), help="JSON output")
    args = parser.parse_args()
    if any(size < 1 for size in args.sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be positive")
    rows = [measure(size, args.repeats, args.seed) for size in args.sizes]
    print(markdown(rows))
    result = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "repeats": args.repeats,
        "seed": args.seed,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
