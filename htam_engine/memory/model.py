"""The Hierarchical Transition Graph (HTG): nodes, edges, statistics, evidence, outcomes.

Everything here is a plain dataclass with a JSON round trip (`to_json` / `from_json`);
nothing is ever pickled. The learning primitives (`Stats.update`, `LocalNode.record`,
`Graph.apply_outcome`) live here so that the in-memory graph and the persistent store
share one update rule.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from htam_engine.vocabulary import BACKENDS, STATUS_TABLE, Status

START = "START"
SEED_SCHEMA_VERSION = 1
EVIDENCE_BOUND = 5
TREND_RATE = 0.3
GLOBAL_PROMPT_CHARS = 700
LOCAL_PROMPT_CHARS = 1200
EXCERPT_CHARS = 8000  # a whole kernel file: an example is shown whole or not at all


class MemoryDataError(ValueError):
    """Memory data (seed, import file, store row) that does not fit the schema."""


def _require(data: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise MemoryDataError(f"{where}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise MemoryDataError(f"{where}: field {key!r} must be a number")
    if not isinstance(value, kind):
        raise MemoryDataError(f"{where}: field {key!r} has the wrong type")
    return value


def _str_list(data: dict[str, Any], key: str, where: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MemoryDataError(f"{where}: field {key!r} must be a list of strings")
    return list(value)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Stats:
    """Runtime statistics; `weight` is the (credit-weighted) sample count n."""

    attempts: int = 0
    compiled: int = 0
    correct: int = 0
    improved: int = 0
    weight: float = 0.0
    mean_reward: float = 0.0
    trend: float = 0.0  # exponential moving average of recent rewards

    def update(
        self, reward: float, compiled: bool, correct: bool, improved: bool, w: float = 1.0
    ) -> None:
        """Fold one reward in with credit `w` (1 for nodes, alpha_k for prefix edges)."""
        self.attempts += 1
        self.compiled += int(compiled)
        self.correct += int(correct)
        self.improved += int(improved)
        if w <= 0:
            return
        self.weight += w
        self.mean_reward += w * (reward - self.mean_reward) / self.weight
        rate = TREND_RATE * min(w, 1.0)
        self.trend = reward if self.attempts == 1 else (1 - rate) * self.trend + rate * reward

    def utility(self, prior: float, n0: float) -> float:
        """Mean reward shrunk towards `prior` with pseudo-count `n0`."""
        return (self.weight * self.mean_reward + n0 * prior) / (self.weight + n0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "stats") -> Stats:
        counts = [
            _require(data, k, int, where) for k in ("attempts", "compiled", "correct", "improved")
        ]
        reals = [
            float(_require(data, k, (int, float), where))
            for k in ("weight", "mean_reward", "trend")
        ]
        if min(counts) < 0 or reals[0] < 0:
            raise MemoryDataError(f"{where}: counts must not be negative")
        if not all(math.isfinite(v) for v in reals):
            raise MemoryDataError(f"{where}: numbers must be finite")
        return cls(*counts, *reals)


@dataclass
class Evidence:
    """One measured case for a local strategy."""

    task_signature: str
    status: Status
    speedup: float | None
    runtime_ms: float | None
    code_excerpt: str = ""
    note: str = ""

    @property
    def family(self) -> str:
        """The operator family of the task it came from (`episode.task_signature` is
        "backend:family:name")."""
        parts = self.task_signature.split(":")
        return parts[1] if len(parts) >= 3 else "unknown"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "evidence") -> Evidence:
        status = _require(data, "status", str, where)
        if status not in STATUS_TABLE:
            raise MemoryDataError(f"{where}: unknown status {status!r}")
        numbers = {}
        for key in ("speedup", "runtime_ms"):
            value = data.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise MemoryDataError(f"{where}: field {key!r} must be a number or null")
            numbers[key] = None if value is None else float(value)
        return cls(
            task_signature=_require(data, "task_signature", str, where),
            status=Status(status),
            code_excerpt=_clip(str(data.get("code_excerpt", "")), EXCERPT_CHARS),
            note=str(data.get("note", "")),
            **numbers,
        )


@dataclass
class GlobalNode:
    """A coarse optimization direction."""

    id: str
    name: str
    intent: str
    goals: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)

    def prompt_text(self) -> str:
        s = self.stats
        lines = [
            f"## {self.name} ({self.id})",
            f"Intent: {self.intent}",
            f"Goals: {'; '.join(self.goals)}",
            f"Risks: {'; '.join(self.risks)}",
            f"History: {s.attempts} attempts, {s.correct} correct, {s.improved} improved, "
            f"mean reward {s.mean_reward:+.2f}",
        ]
        return _clip("\n".join(lines), GLOBAL_PROMPT_CHARS)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LocalNode:
    """An executable strategy under exactly one global direction."""

    id: str
    parent: str
    name: str
    edit_pattern: str
    checks: list[str] = field(default_factory=list)
    applicability: list[str] = field(default_factory=list)
    mechanical: str | None = None
    stats: Stats = field(default_factory=Stats)
    evidence_positive: list[Evidence] = field(default_factory=list)
    evidence_negative: list[Evidence] = field(default_factory=list)
    # Where it applies (seed data): operator families (empty = any), tags that must all
    # be present, tags none of which may be; `texts` rewrites the edit pattern per family.
    families: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    forbids: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    # Where its mechanical rewrite cannot read the code, a model may still write it (a
    # generic strategy, e.g. register tiling of the model's own GEMM); else the rewrite's
    # refusal is its test of fit (a fused softmax rewrite says where a softmax is).
    model_writes: bool = False
    # A new change each time it is chosen (the model's own strategy): neither a try on
    # the same code nor a failure rules it out; the model ends it by setting it aside.
    open_ended: bool = False

    def fits(self, family: str, tags: set[str]) -> str | None:
        """None when the strategy applies to a kernel of `family` with `tags`, else why not."""
        if self.families and family not in self.families:
            return f"for {'/'.join(self.families)} kernels, not {family}"
        missing = [t for t in self.needs if t not in tags]
        if missing:
            return f"needs {', '.join(missing)}"
        present = [t for t in self.forbids if t in tags]
        if present:
            return f"not with {', '.join(present)}"
        return None

    def edit_for(self, family: str) -> str:
        return self.texts.get(family, self.edit_pattern)

    def record(self, evidence: Evidence) -> None:
        """Keep the most useful cases: the largest speedups, and recent distinct failures."""
        if evidence.status == Status.IMPROVED:
            kept = [
                e for e in self.evidence_positive if e.task_signature != evidence.task_signature
            ]
            best_same = [e for e in self.evidence_positive if e not in kept]
            kept += [max([*best_same, evidence], key=_speedup_key)]
            kept.sort(key=_speedup_key, reverse=True)
            self.evidence_positive = kept[:EVIDENCE_BOUND]
        else:
            key = (evidence.status, evidence.task_signature)
            older = [e for e in self.evidence_negative if (e.status, e.task_signature) != key]
            self.evidence_negative = [evidence, *older][:EVIDENCE_BOUND]

    def example(self, family: str = "") -> Evidence | None:
        """The best positive case from a task of `family`, else the best of any."""
        same = [e for e in self.evidence_positive if e.family == family]
        found = same or self.evidence_positive
        return found[0] if found else None

    def prompt_text(self, family: str = "", rewrites: bool = False) -> str:
        """The strategy for a prompt: its edit (for `family`), checks, where it worked
        (the measured number; the code goes in the generation prompt whole) and failed.
        `rewrites`: its mechanical rewrite, not the model, writes the next version (said
        to a chooser; a code prompt's strategy is always the model's to write)."""
        lines = [
            f"### {self.name} ({self.id}){' [mechanical rewrite]' if rewrites else ''}",
            f"Edit: {self.edit_for(family)}",
            f"Checks: {'; '.join(self.checks)}",
        ]
        best = self.example(family)
        if best is not None:
            lines.append(
                f"Worked before (memory): {best.task_signature} {_fmt_speedup(best.speedup)}"
            )
        for bad in self.evidence_negative[:2]:
            label = "No gain" if bad.status == Status.NOT_IMPROVED else "Failed"
            ratio = f" ({bad.speedup:.2f}x the best)" if bad.speedup else ""
            note = f": {_clip(bad.note, 120)}" if bad.note else ""
            lines.append(
                f"{label} before (memory): {bad.status}{ratio} on {bad.task_signature}{note}"
            )
        return _clip("\n".join(lines), LOCAL_PROMPT_CHARS)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _speedup_key(evidence: Evidence) -> float:
    return evidence.speedup or 0.0


def _fmt_speedup(value: float | None) -> str:
    return "" if value is None else f"({value:.2f}x)"


@dataclass
class Edge:
    """A transition between global directions (the source may be START)."""

    src: str
    dst: str
    when: str = ""
    why: str = ""
    risks: list[str] = field(default_factory=list)
    prior: float = 0.0
    stats: Stats = field(default_factory=Stats)
    priors: dict[str, float] = field(default_factory=dict)  # per operator family

    def prior_for(self, family: str) -> float:
        return self.priors.get(family, self.prior)

    def utility(self, n0: float, family: str = "") -> float:
        return self.stats.utility(self.prior_for(family), n0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """What one step produced; the input to the update."""

    backend: str
    task_signature: str
    prefix: list[str]  # oldest to newest global ids, START first when the run is young
    alphas: list[float]  # alphas[i] is the weight prefix[i] had in the decision
    global_id: str
    local_id: str
    status: Status
    compiled: bool
    correct: bool
    speedup: float | None
    runtime_ms: float | None
    reward: float
    code_excerpt: str = ""
    note: str = ""  # what happened, for the evidence (error excerpt, max error, duel)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Outcome:
        where = "outcome"
        prefix = _str_list(data, "prefix", where) if isinstance(data, dict) else []
        alphas = data.get("alphas", []) if isinstance(data, dict) else []
        if not isinstance(alphas, list) or len(alphas) != len(prefix):
            raise MemoryDataError("outcome: alphas must be a list as long as prefix")
        evidence = Evidence.from_json(data, where)
        reward = float(_require(data, "reward", (int, float), where))
        if not math.isfinite(reward):
            raise MemoryDataError("outcome: reward must be finite")
        return cls(
            backend=_require(data, "backend", str, where),
            task_signature=evidence.task_signature,
            prefix=prefix,
            alphas=[float(a) for a in alphas],
            global_id=_require(data, "global_id", str, where),
            local_id=_require(data, "local_id", str, where),
            status=evidence.status,
            compiled=bool(_require(data, "compiled", bool, where)),
            correct=bool(_require(data, "correct", bool, where)),
            speedup=evidence.speedup,
            runtime_ms=evidence.runtime_ms,
            reward=reward,
            code_excerpt=evidence.code_excerpt,
            note=evidence.note,
        )

    def evidence(self) -> Evidence:
        return Evidence(
            task_signature=self.task_signature,
            status=self.status,
            speedup=self.speedup,
            runtime_ms=self.runtime_ms,
            code_excerpt=_clip(self.code_excerpt, EXCERPT_CHARS),
            note=self.note,  # what happened; the reward is in the statistics
        )

    def update_stats(self, stats: Stats, w: float = 1.0) -> None:
        stats.update(self.reward, self.compiled, self.correct, self.status == Status.IMPROVED, w)


@dataclass
class Graph:
    """One backend's memory: seed priors plus everything learned."""

    backend: str
    globals: dict[str, GlobalNode]
    locals: dict[str, LocalNode]
    edges: dict[tuple[str, str], Edge]
    seed_version: str = ""
    # Names what the graph holds: the learned rows it was loaded with (MemoryStore.graph)
    # and each outcome applied since; results computed from a graph (the hover's preview)
    # are cached under it. Not part of equality: equal contents make equal graphs.
    revision: str = field(default="", compare=False)

    def locals_of(self, global_id: str) -> list[LocalNode]:
        return [node for node in self.locals.values() if node.parent == global_id]

    def edge(self, src: str, dst: str) -> Edge:
        """The edge src -> dst, created (prior 0, no stats) when neither seed nor data has it."""
        found = self.edges.get((src, dst))
        if found is None:
            found = self.edges[(src, dst)] = Edge(src, dst, why="learned from trajectories")
        return found

    def check_outcome(self, outcome: Outcome) -> None:
        """Reject an outcome that names nodes this graph does not have."""
        if outcome.status not in STATUS_TABLE:
            raise MemoryDataError(f"unknown outcome status {outcome.status!r}")
        if len(outcome.alphas) != len(outcome.prefix) or not math.isfinite(outcome.reward):
            raise MemoryDataError("outcome needs one alpha per prefix entry and a finite reward")
        if outcome.backend != self.backend:
            raise MemoryDataError(f"outcome for {outcome.backend!r} applied to {self.backend!r}")
        local = self.locals.get(outcome.local_id)
        if outcome.global_id not in self.globals or local is None:
            raise MemoryDataError(
                f"outcome names unknown nodes {outcome.global_id}/{outcome.local_id}"
            )
        if local.parent != outcome.global_id:
            raise MemoryDataError(f"{outcome.local_id} is not under {outcome.global_id}")
        unknown = [p for p in outcome.prefix if p != START and p not in self.globals]
        if unknown:
            raise MemoryDataError(f"outcome prefix names unknown directions {unknown}")

    def apply_outcome(self, outcome: Outcome) -> None:
        """The update rule: node stats, bounded evidence, each prefix edge by its alpha."""
        self.check_outcome(outcome)
        outcome.update_stats(self.globals[outcome.global_id].stats)
        local = self.locals[outcome.local_id]
        outcome.update_stats(local.stats)
        local.record(outcome.evidence())
        for src, alpha in zip(outcome.prefix, outcome.alphas, strict=True):
            outcome.update_stats(self.edge(src, outcome.global_id).stats, alpha)
        self.revision = revision_of(self.revision, json.dumps(outcome.to_json(), sort_keys=True))


def revision_of(*parts: str) -> str:
    """A short digest naming a graph's content (see `Graph.revision`)."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


# --- seed -----------------------------------------------------------------------------


@cache
def _seed_data(backend: str) -> dict[str, Any]:
    if backend not in BACKENDS:
        raise MemoryDataError(
            f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})"
        )
    text = resources.files("htam_engine.memory").joinpath(f"seed/{backend}.toml").read_text()
    return tomllib.loads(text)


def load_seed(backend: str) -> Graph:
    """A fresh Graph holding the seed priors of `backend` (no learned statistics)."""
    data = _seed_data(backend)
    if data.get("schema_version") != SEED_SCHEMA_VERSION:
        raise MemoryDataError(f"seed {backend}: unsupported schema_version")
    globals_ = {
        g["id"]: GlobalNode(
            id=g["id"],
            name=g["name"],
            intent=g["intent"],
            goals=list(g.get("goals", [])),
            triggers=list(g.get("triggers", [])),
            risks=list(g.get("risks", [])),
        )
        for g in data["global"]
    }
    locals_ = {
        lo["id"]: LocalNode(
            id=lo["id"],
            parent=lo["parent"],
            name=lo["name"],
            edit_pattern=lo["edit_pattern"],
            checks=list(lo.get("checks", [])),
            applicability=list(lo.get("applicability", [])),
            mechanical=lo.get("mechanical"),
            families=list(lo.get("families", [])),
            needs=list(lo.get("needs", [])),
            forbids=list(lo.get("forbids", [])),
            texts=dict(lo.get("texts", {})),
            model_writes=bool(lo.get("model_writes", False)),
            open_ended=bool(lo.get("open_ended", False)),
        )
        for lo in data["local"]
    }
    edges = {
        (e["src"], e["dst"]): Edge(
            src=e["src"],
            dst=e["dst"],
            when=e.get("when", ""),
            why=e.get("why", ""),
            risks=list(e.get("risks", [])),
            prior=float(e.get("prior", 0.0)),
            priors={k: float(v) for k, v in e.get("priors", {}).items()},
        )
        for e in data["edge"]
    }
    return Graph(backend, globals_, locals_, edges, seed_version=str(data["seed_version"]))


def seed_version(backend: str) -> str:
    return str(_seed_data(backend)["seed_version"])
