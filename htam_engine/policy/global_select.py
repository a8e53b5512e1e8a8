"""Transition-aware global selection (design step 3) and its ablations.

score(g) = sum_k alpha_k U(g_{t-k} -> g) + beta U(g) + gamma trigger(g, s_t)
alpha    = softmax_k(-lam (k - 1) + relevance_k)
pi(g)    = softmax(score / tau), sampled from a seeded RNG.

relevance_k comes from how step t-k ended (`STATUS_TABLE` in htam_engine.vocabulary): a
step that improved the kernel tells more about what should follow than one that failed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from htam_engine.decisions import Candidate, EdgeTerm, GlobalDecision, PrefixWeight
from htam_engine.memory.model import START, Graph, LocalNode, Stats
from htam_engine.policy.local_select import NoApplicableStrategy
from htam_engine.state import PathEntry, State
from htam_engine.vocabulary import STATUS_TABLE, Status

Mode = Literal["htam", "no_transitions", "flat", "no_local", "random", "greedy"]
MODES: tuple[str, ...] = ("htam", "no_transitions", "flat", "no_local", "random", "greedy")


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the policy. `mode` selects the full method or one of its ablations.

    "no_local" selects globals exactly like "htam"; the loop then skips local selection.
    "greedy" always takes the direction whose own utility and triggers score highest (no
    transitions, no sampling): the exploit-only baseline.
    """

    K: int = 3
    lam: float = 0.7
    beta: float = 0.5
    gamma: float = 0.5
    tau: float = 0.3
    n0: float = 3.0
    mode: Mode = "htam"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown policy mode {self.mode!r} (expected one of {MODES})")
        if self.K < 1 or self.tau <= 0 or self.n0 < 0:
            raise ValueError("policy needs K >= 1, tau > 0 and n0 >= 0")


def make_prefix(path: Sequence[PathEntry], K: int) -> list[str]:
    """The last K global ids, oldest first, padded with START while the run is younger than K."""
    recent = [entry.global_id for entry in path[-K:]]
    return [START] * (K - len(recent)) + recent


def _relevance(status: str) -> float:
    info = STATUS_TABLE.get(status)
    return info.relevance if info else 0.0


def prefix_weights(prefix: Sequence[str], state: State, lam: float) -> list[PrefixWeight]:
    """alpha_k for k = 1 (most recent) .. len(prefix), from position and step outcome."""
    raw = []
    for k in range(1, len(prefix) + 1):
        source = prefix[-k]
        entry = state.path[-k] if k <= len(state.path) else None
        relevance = _relevance(entry.status) if entry and entry.global_id == source else 0.0
        raw.append((k, source, relevance, -lam * (k - 1) + relevance))
    alphas = softmax([logit for *_, logit in raw])
    return [PrefixWeight(k, s, r, a) for (k, s, r, _), a in zip(raw, alphas, strict=True)]


def softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def _trigger(tags: Sequence[str], state_tags: set[str]) -> tuple[list[str], float]:
    matches = sorted(set(tags) & state_tags)
    return matches, (len(matches) / len(set(tags)) if tags else 0.0)


def _node_terms(stats: Stats, config: PolicyConfig) -> tuple[float, float, float]:
    return stats.weight, stats.mean_reward, stats.utility(0.0, config.n0)


def select_global(
    graph: Graph,
    prefix: Sequence[str],
    state: State,
    config: PolicyConfig,
    rng: random.Random,
) -> GlobalDecision:
    """Score every direction with a strategy that fits the state's kernel (or every such
    strategy in flat mode) and sample one."""
    weights = prefix_weights(prefix, state, config.lam)
    tags = state.tags()
    fitting = [node for node in graph.locals.values() if node.fits(state.family, tags) is None]
    if not fitting:
        raise NoApplicableStrategy(f"no strategy fits this {state.family} kernel")
    if config.mode == "flat":
        candidates = [_local_candidate(node, graph, tags, config) for node in fitting]
    else:
        directions = [gid for gid in graph.globals if gid in {n.parent for n in fitting}]
        candidates = [_global_candidate(gid, graph, weights, state, config) for gid in directions]
    if config.mode == "random":
        probabilities = [1.0 / len(candidates)] * len(candidates)
    elif config.mode == "greedy":
        top = max(range(len(candidates)), key=lambda i: candidates[i].score)
        probabilities = [float(i == top) for i in range(len(candidates))]
    else:
        probabilities = softmax([c.score / config.tau for c in candidates])
    for candidate, probability in zip(candidates, probabilities, strict=True):
        candidate.probability = probability
    draw = rng.random()
    chosen = _sample(candidates, draw)
    return GlobalDecision(
        chosen=chosen.parent or chosen.id,
        chosen_local=chosen.id if chosen.parent else None,
        mode=config.mode,
        temperature=config.tau,
        prefix=list(prefix),
        weights=weights,
        candidates=candidates,
        draw=draw,
    )


def _sample(candidates: list[Candidate], draw: float) -> Candidate:
    cumulative = 0.0
    for candidate in candidates:
        cumulative += candidate.probability
        if draw < cumulative:
            return candidate
    return candidates[-1]


def _global_candidate(
    gid: str, graph: Graph, weights: list[PrefixWeight], state: State, config: PolicyConfig
) -> Candidate:
    """A direction scored by its edges from the prefix (their priors for the state's
    operator family), its own utility and its triggers."""
    node, tags = graph.globals[gid], state.tags()
    terms = []
    if config.mode not in ("no_transitions", "greedy"):
        for w in weights:
            edge = graph.edges.get((w.source, gid))
            stats, prior = (edge.stats, edge.prior_for(state.family)) if edge else (Stats(), 0.0)
            utility = stats.utility(prior, config.n0)
            terms.append(
                EdgeTerm(
                    w.source,
                    w.k,
                    w.alpha,
                    stats.weight,
                    stats.mean_reward,
                    prior,
                    utility,
                    w.alpha * utility,
                )
            )
    n, mean, utility = _node_terms(node.stats, config)
    matches, trigger = _trigger(node.triggers, tags)
    score = sum(t.contribution for t in terms) + config.beta * utility + config.gamma * trigger
    return Candidate(
        gid,
        node.name,
        None,
        terms,
        n,
        mean,
        utility,
        matches,
        len(set(node.triggers)),
        trigger,
        score,
    )


def _local_candidate(
    node: LocalNode, graph: Graph, tags: set[str], config: PolicyConfig
) -> Candidate:
    """Flat retrieval: a local strategy scored by its own utility and applicability match."""
    n, mean, utility = _node_terms(node.stats, config)
    matches, trigger = _trigger(node.applicability, tags)
    score = config.beta * utility + config.gamma * trigger
    return Candidate(
        node.id,
        node.name,
        node.parent,
        [],
        n,
        mean,
        utility,
        matches,
        len(set(node.applicability)),
        trigger,
        score,
    )


CONVERGED_AFTER = 3  # steps without a kept improvement before the memory may call it


def predicts_no_gain(decision: GlobalDecision, state: State) -> bool:
    """The memory expects nothing more: the last `CONVERGED_AFTER` steps kept nothing and
    no direction's learned utility (edges and node, triggers aside) is positive."""
    recent = state.path[-CONVERGED_AFTER:]
    if len(recent) < CONVERGED_AFTER or any(p.status == Status.IMPROVED for p in recent):
        return False
    learned = [
        sum(t.contribution for t in c.edge_terms) + c.node_utility for c in decision.candidates
    ]
    return max(learned, default=0.0) <= 0.0
