"""Policy quality in simulation: does HTAM's memory pick better strategies than its ablations?

    .venv/bin/python benchmarks/simulation.py [--quick] [--seed S] [--out FILE.json]

The environment is synthetic, its strategies are real: the directions and strategies are
the seed graph of a backend (`load_seed`), and every arm learns with the real selection
code: the loop's own step core (`htam_engine.episode.Episode`: state, decide, judge and
the `Outcome` with its reward) and the real update (`Graph.apply_outcome`). What is
hidden from the arms (a *world*, drawn from the seed):

- every strategy has a shared effect on log speedup, N(STRATEGY_MEAN, strategy_sd);
- tasks come in families; a family shifts every strategy's effect by N(0, family_sd),
  and a fraction `fail_rate` of the strategies fail to compile on the whole family;
- each task adds its own N(0, task_sd) per strategy, and every measurement N(0, noise_sd);
- transitions: each direction has one hidden right predecessor (another direction or
  START); applying a strategy of that direction right after it adds
  `transition_strength` to the log gain;
- diminishing returns: a strategy re-applied on a task keeps `repeat_decay`^k of its
  effect, and every gain is divided by (1 + best log speedup so far / saturation);
- a correct-looking step is wrong with probability `incorrect_rate`.

A step ends like the real loop's: compile_error / incorrect / improved (>= 1.02x the best
so far) / not_improved, rewarded by `htam_engine.policy.reward`. Measurement noise is a
function of (task, step, strategy) only, so every arm meets identical tasks and the same
luck for the same choice. Memory persists across tasks (online learning, one fresh seed
graph per arm). The policy runs with its defaults: nothing is tuned on these seeds.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from htam_engine.episode import IMPROVE_MARGIN, Decision, Episode
from htam_engine.memory import START, Graph, load_seed
from htam_engine.policy import (
    EvidenceLocalSelector,
    GlobalDecision,
    LocalDecision,
    PolicyConfig,
    prefix_weights,
)
from htam_engine.state import State
from htam_engine.vocabulary import Status

ARMS = ("htam", "no_transitions", "flat", "no_local", "greedy", "random")
FAMILY_TAGS = ("elementwise", "reduction", "matmul", "fused")
FEATURE_TAGS = {
    "cpu": ("no_openmp", "no_simd", "no_restrict", "low_opt", "loops", "nested_loops"),
    "cuda": (
        "scalar_loads",
        "no_shared_memory",
        "no_restrict",
        "no_grid_stride",
        "loops",
        "nested_loops",
        "small_block",
        "no_launch_bounds",
    ),
}
STRATEGY_MEAN = 0.05
EARLY_TASKS = 20  # transfer matters most before the cold memory has learned anything
THRESHOLD = 1.5  # "steps to reach": best speedup over the start >= this, fixed a priori
TRANSFER_ARMS = ("htam", "flat", "greedy")
SHARED_FAMILY_SD = 0.05  # transfer is also measured where families share more structure
# Diagnostic arm: HTAM whose local ranking drops the bonus for mechanical strategies
# (every strategy is implementable here, as with an LLM); see README "Findings".
Z95 = 1.96


@dataclass(frozen=True)
class EnvConfig:
    backend: str = "cuda"
    n_families: int = 8
    transition_strength: float = 0.3
    strategy_sd: float = 0.15
    family_sd: float = 0.2
    task_sd: float = 0.08
    noise_sd: float = 0.03
    fail_rate: float = 0.2
    incorrect_rate: float = 0.05
    repeat_decay: float = 0.3
    saturation: float = 1.5


@dataclass(frozen=True)
class Family:
    id: int
    tag: str
    features: frozenset[str]
    effects: dict[str, float]  # strategy -> log-gain effect on this family
    fails: frozenset[str]  # strategies that do not compile on this family


@dataclass(frozen=True)
class World:
    config: EnvConfig
    parent: dict[str, str]  # strategy -> its direction
    predecessor: dict[str, str]  # direction -> its hidden right predecessor
    families: tuple[Family, ...]


@dataclass(frozen=True)
class SimTask:
    seed: int
    family: Family
    effects: dict[str, float]

    @property
    def signature(self) -> str:
        return f"sim:{self.family.tag}:f{self.family.id}:t{self.seed}"


def make_world(config: EnvConfig, seed: int) -> World:
    """Draw the hidden structure: strategy effects, families, transitions."""
    rng = random.Random(f"world:{seed}")
    graph = load_seed(config.backend)
    strategies = list(graph.locals)
    shared = {lid: rng.gauss(STRATEGY_MEAN, config.strategy_sd) for lid in strategies}
    directions = list(graph.globals)
    predecessor = {g: rng.choice([START, *[d for d in directions if d != g]]) for g in directions}
    families = []
    for i in range(config.n_families):
        n_fail = round(config.fail_rate * len(strategies))
        families.append(
            Family(
                id=i,
                tag=FAMILY_TAGS[i % len(FAMILY_TAGS)],
                features=frozenset(rng.sample(FEATURE_TAGS[config.backend], 3)),
                effects={lid: shared[lid] + rng.gauss(0, config.family_sd) for lid in strategies},
                fails=frozenset(rng.sample(strategies, n_fail)),
            )
        )
    parent = {lid: node.parent for lid, node in graph.locals.items()}
    return World(config, parent, predecessor, tuple(families))


def make_tasks(world: World, families: Sequence[int], seeds: Sequence[int]) -> list[SimTask]:
    """One task per seed; its family cycles through `families`."""
    tasks = []
    for i, seed in enumerate(seeds):
        family = world.families[families[i % len(families)]]
        rng = random.Random(f"task:{seed}")
        effects = {lid: e + rng.gauss(0, world.config.task_sd) for lid, e in family.effects.items()}
        tasks.append(SimTask(seed, family, effects))
    return tasks


def outcome(
    world: World, task: SimTask, step: int, previous: str, local_id: str, times: int, best: float
) -> tuple[Status | None, float | None]:
    """(failure status, None) or (None, log gain) of applying `local_id` at `step`; pure
    in its arguments."""
    if local_id in task.family.fails:
        return Status.COMPILE_ERROR, None
    rng = random.Random(f"noise:{task.seed}:{step}:{local_id}")
    if rng.random() < world.config.incorrect_rate:
        return Status.INCORRECT, None
    cfg = world.config
    bonus = cfg.transition_strength if world.predecessor[world.parent[local_id]] == previous else 0
    effect = (task.effects[local_id] + bonus) * cfg.repeat_decay**times
    return None, effect / (1 + best / cfg.saturation) + rng.gauss(0, cfg.noise_sd)


@dataclass
class TaskResult:
    best_log: float  # log best speedup over the start after T steps
    fast: bool  # some correct candidate faster than the start
    steps_to_threshold: int | None
    correct_steps: int
    compile_errors: int
    path: list[str] = field(default_factory=list)


def choose(arm: str, episode: Episode, graph: Graph, state: State, rng: random.Random) -> Decision:
    """(g_t, l_t) for one step of `arm`: the loop's own decision, or the greedy baseline."""
    if arm != "greedy":
        return episode.decide(graph, state, rng, EvidenceLocalSelector())
    node = max(graph.locals.values(), key=lambda n: n.stats.mean_reward)
    weights = prefix_weights(episode.prefix, state, episode.config.lam)
    greedy = GlobalDecision(node.parent, node.id, "greedy", 0.0, episode.prefix, weights)
    return Decision(greedy, LocalDecision(node.id, "greedy"))


def run_task(
    arm: str, graph: Graph, world: World, task: SimTask, steps: int, rng: random.Random
) -> TaskResult:
    """T steps on one task, learning from each outcome exactly like the loop."""
    mode = arm if arm != "greedy" else "htam"
    policy = PolicyConfig(mode=mode)  # type: ignore[arg-type]
    episode = Episode(graph.backend, task.family.tag, task.signature, policy, IMPROVE_MARGIN)
    best, applied = 0.0, Counter[str]()
    result = TaskResult(0.0, False, None, 0, 0)
    for step in range(1, steps + 1):
        state = episode.state(set(task.family.features), best_speedup=math.exp(best))
        decision = choose(arm, episode, graph, state, rng)
        local_id = decision.local_id
        failed, gain = outcome(
            world, task, step, episode.prefix[-1], local_id, applied[local_id], best
        )
        applied[local_id] += 1
        ratio = None if gain is None else math.exp(gain)
        status = failed or episode.judge(ratio)
        result.correct_steps += ratio is not None
        if status == Status.IMPROVED and gain is not None:
            best += gain
            result.fast = True
            if result.steps_to_threshold is None and best >= math.log(THRESHOLD):
                result.steps_to_threshold = step
        result.compile_errors += status == Status.COMPILE_ERROR
        graph.apply_outcome(episode.finish(decision, status, speedup=ratio))
        result.path.append(decision.global_id)
    result.best_log = best
    return result


def run_arm(
    arm: str, world: World, tasks: Sequence[SimTask], steps: int, seed: int, graph: Graph | None
) -> tuple[list[TaskResult], Graph]:
    """Every task in order with one memory that persists across them (online)."""
    graph = graph or load_seed(world.config.backend)
    results = [
        run_task(arm, graph, world, task, steps, random.Random(f"policy:{seed}:{task.seed}"))
        for task in tasks
    ]
    return results, graph


# --- statistics ------------------------------------------------------------------------


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean with a normal-approximation 95 % interval (n >= 200 tasks in a full run)."""
    m = statistics.fmean(values)
    half = Z95 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": m, "lo": m - half, "hi": m + half}


def summarize(results: Sequence[TaskResult], steps: int) -> dict[str, Any]:
    reach = [r.steps_to_threshold for r in results]
    return {
        "best_log": mean_ci([r.best_log for r in results]),
        "geomean_speedup": {
            k: math.exp(v) for k, v in mean_ci([r.best_log for r in results]).items()
        },
        "fast_rate": mean_ci([float(r.fast) for r in results]),
        "reach_rate": mean_ci([float(s is not None) for s in reach]),
        # tasks that never reach the threshold count as T + 1 (censored)
        "steps_to_threshold": mean_ci([float(s if s is not None else steps + 1) for s in reach]),
        "correct_rate": mean_ci([r.correct_steps / steps for r in results]),
        "compile_error_rate": mean_ci([r.compile_errors / steps for r in results]),
    }


def paired(a: Sequence[TaskResult], b: Sequence[TaskResult]) -> dict[str, float]:
    """Mean difference of best log speedup, task by task (same tasks in both)."""
    return mean_ci([x.best_log - y.best_log for x, y in zip(a, b, strict=True)])


# --- experiments -------------------------------------------------------------------------


def compare_arms(world: World, tasks: Sequence[SimTask], steps: int, seed: int) -> dict[str, Any]:
    per_arm = {arm: run_arm(arm, world, tasks, steps, seed, None)[0] for arm in ARMS}
    return {
        "arms": {arm: summarize(res, steps) for arm, res in per_arm.items()},
        "htam_minus": {arm: paired(per_arm["htam"], res) for arm, res in per_arm.items()},
    }


def transfer(world: World, n: int, steps: int, seed: int, arms: Sequence[str]) -> dict[str, Any]:
    """Warm the memory on the first half of the families, evaluate on the other half."""
    half = world.config.n_families // 2
    train = make_tasks(world, range(half), [seed * 100_000 + 50_000 + i for i in range(n)])
    held_out = make_tasks(
        world, range(half, world.config.n_families), [seed * 100_000 + 70_000 + i for i in range(n)]
    )
    out = {}
    for arm in arms:
        _, warm = run_arm(arm, world, train, steps, seed, None)
        cold_res, _ = run_arm(arm, world, held_out, steps, seed, None)
        warm_res, _ = run_arm(arm, world, held_out, steps, seed, copy.deepcopy(warm))
        early = slice(0, EARLY_TASKS)
        out[arm] = {
            "cold": mean_ci([r.best_log for r in cold_res]),
            "warm": mean_ci([r.best_log for r in warm_res]),
            "warm_minus_cold": paired(warm_res, cold_res),
            "warm_minus_cold_early": paired(warm_res[early], cold_res[early]),
        }
    return out


def sweep(
    config: EnvConfig, strengths: Sequence[float], n: int, steps: int, seed: int
) -> dict[str, Any]:
    """Best log speedup of HTAM, no-transitions and flat as the hidden transitions strengthen."""
    out = {}
    for s in strengths:
        world = make_world(replace(config, transition_strength=s), seed)
        tasks = make_tasks(world, range(config.n_families), [seed * 100_000 + i for i in range(n)])
        per = {a: run_arm(a, world, tasks, steps, seed, None)[0] for a in ARMS[:3]}
        out[str(s)] = {
            **{a: mean_ci([r.best_log for r in res]) for a, res in per.items()},
            "htam_minus_flat": paired(per["htam"], per["flat"]),
        }
    return out


def robustness(config: EnvConfig, world_seeds: Sequence[int], n: int, steps: int) -> dict[str, Any]:
    """HTAM against flat retrieval in other hidden worlds (one world is one draw)."""
    out = {}
    for ws in world_seeds:
        world = make_world(config, ws)
        tasks = make_tasks(world, range(config.n_families), [ws * 100_000 + i for i in range(n)])
        per = {a: run_arm(a, world, tasks, steps, ws, None)[0] for a in ("htam", "flat")}
        out[str(ws)] = {
            **{a: mean_ci([r.best_log for r in res]) for a, res in per.items()},
            "htam_minus_flat": paired(per["htam"], per["flat"]),
        }
    return out


def run(quick: bool, seed: int, backends: Sequence[str], steps: int = 6) -> dict[str, Any]:
    n = 60 if quick else 240
    strengths = (0.0, 0.3, 1.0) if quick else (0.0, 0.15, 0.3, 0.6, 1.0)
    world_seeds = range(seed + 1, seed + (3 if quick else 6))
    out: dict[str, Any] = {"seed": seed, "tasks": n, "steps": steps, "backends": {}}
    for backend in backends:
        config = EnvConfig(backend=backend)
        world = make_world(config, seed)
        tasks = make_tasks(world, range(config.n_families), [seed * 100_000 + i for i in range(n)])
        out["backends"][backend] = {
            "env": config.__dict__,
            "hidden_predecessor": world.predecessor,
            "comparison": compare_arms(world, tasks, steps, seed),
            "transfer": {
                str(sd): transfer(
                    make_world(replace(config, family_sd=sd), seed), n, steps, seed, TRANSFER_ARMS
                )
                for sd in sorted({SHARED_FAMILY_SD, config.family_sd})
            },
            "transition_sweep": sweep(config, strengths, n, steps, seed),
            "other_worlds": robustness(config, world_seeds, n, steps),
        }
    out["markdown"] = markdown(out)
    return out


# --- report ------------------------------------------------------------------------------


def _ci(d: dict[str, float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(d['mean'])} [{fmt.format(d['lo'])}, {fmt.format(d['hi'])}]"


def verdict(diff: dict[str, float]) -> str:
    """One honest sentence on HTAM against flat retrieval, from the paired interval."""
    if diff["lo"] > 0:
        word = "beats"
    elif diff["hi"] < 0:
        word = "does NOT beat (is worse than)"
    else:
        word = "does NOT clearly beat (interval includes 0)"
    return f"HTAM {word} flat retrieval here: paired difference {_ci(diff)} in log speedup."


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"Simulation: {out['tasks']} tasks x T={out['steps']} per arm, seed {out['seed']}, "
        f"95 % CIs (normal approx.); threshold {THRESHOLD}x.",
    ]
    for backend, res in out["backends"].items():
        cmp = res["comparison"]
        lines += [
            "",
            f"#### {backend} seed graph",
            "",
            "| arm | geomean best speedup | best log speedup | Fast@1-style | "
            f"reach {THRESHOLD}x | steps to {THRESHOLD}x | correct steps | HTAM - arm (log) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm, s in cmp["arms"].items():
            lines.append(
                f"| {arm} | {_ci(s['geomean_speedup'])} | {_ci(s['best_log'])} | "
                f"{_ci(s['fast_rate'], '{:.2f}')} | {_ci(s['reach_rate'], '{:.2f}')} | "
                f"{_ci(s['steps_to_threshold'], '{:.2f}')} | {_ci(s['correct_rate'], '{:.2f}')} | "
                f"{_ci(cmp['htam_minus'][arm]) if arm != 'htam' else '-'} |"
            )
        lines += ["", verdict(cmp["htam_minus"]["flat"])]
        lines += [
            "",
            "Transfer (best log speedup on held-out families; warm = learned on the others;"
            " family sd = how much families differ):",
            "",
            "| family sd | arm | cold | warm | warm - cold | "
            f"warm - cold, first {EARLY_TASKS} tasks |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for sd, arms in res["transfer"].items():
            for arm, t in arms.items():
                lines.append(
                    f"| {sd} | {arm} | {_ci(t['cold'])} | {_ci(t['warm'])} | "
                    f"{_ci(t['warm_minus_cold'])} | {_ci(t['warm_minus_cold_early'])} |"
                )
        lines += [
            "",
            "Hidden transition strength sweep (best log speedup):",
            "",
            "| strength | htam | no_transitions | flat | htam - flat |",
            "| --- | --- | --- | --- | --- |",
        ]
        for s, row in res["transition_sweep"].items():
            lines.append(
                f"| {s} | {_ci(row['htam'])} | {_ci(row['no_transitions'])} | "
                f"{_ci(row['flat'])} | {_ci(row['htam_minus_flat'])} |"
            )
        lines += [
            "",
            "Other hidden worlds (same settings, other world seeds):",
            "",
            "| world seed | htam | flat | htam - flat |",
            "| --- | --- | --- | --- |",
        ]
        for ws, row in res["other_worlds"].items():
            lines.append(
                f"| {ws} | {_ci(row['htam'])} | {_ci(row['flat'])} | "
                f"{_ci(row['htam_minus_flat'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 tasks instead of 240")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="+", default=["cuda", "cpu"], choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path, default=Path("simulation.json"), help="JSON output")
    args = parser.parse_args()
    out = run(args.quick, args.seed, args.backends)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(out["markdown"])


if __name__ == "__main__":
    main()
