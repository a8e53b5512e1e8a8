"""benchmarks/simulation.py: the synthetic environment behaves as documented and is fair."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from htam_engine.memory import START, Graph, load_seed
from htam_engine.policy import PolicyConfig, select_global
from htam_engine.state import State

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "simulation.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_simulation", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


sim = _load()


def _world(strength: float = 0.3, backend: str = "cuda", seed: int = 1) -> Any:
    return sim.make_world(sim.EnvConfig(backend=backend, transition_strength=strength), seed)


def test_same_seed_gives_the_same_results() -> None:
    world = _world()
    tasks = sim.make_tasks(world, range(8), range(100, 130))
    first = sim.compare_arms(world, tasks, 6, seed=3)
    again = sim.compare_arms(_world(), sim.make_tasks(_world(), range(8), range(100, 130)), 6, 3)
    assert first == again
    other = sim.compare_arms(world, tasks, 6, seed=4)
    assert other != first  # the policy seed matters, so the equality above is not vacuous


def test_arms_meet_identical_tasks_and_luck() -> None:
    world = _world()
    task = sim.make_tasks(world, range(8), [7])[0]
    local_id = next(iter(world.parent))
    before = sim.outcome(world, task, 2, START, local_id, 0, 0.0)
    for arm in sim.ARMS:  # running arms (and drawing from the global RNG) changes nothing
        sim.run_arm(arm, world, sim.make_tasks(world, range(8), range(5)), 6, 0, None)
    random.random()
    assert sim.outcome(world, task, 2, START, local_id, 0, 0.0) == before
    assert sim.make_tasks(world, range(8), [7])[0] == task


def test_hidden_structure_transitions_failures_and_diminishing_returns() -> None:
    world = _world(strength=0.5)
    task = sim.make_tasks(world, range(8), [11])[0]

    def gain(step: int, previous: str, lid: str, times: int = 0, best: float = 0.0) -> float:
        status, value = sim.outcome(world, task, step, previous, lid, times, best)
        assert status is None and value is not None
        return float(value)

    def compiles_correctly(lid: str) -> bool:
        return all(sim.outcome(world, task, s, START, lid, 0, 0.0)[0] is None for s in (1, 3))

    lid = next(
        lid for lid in world.parent if compiles_correctly(lid) and abs(task.effects[lid]) > 0.2
    )
    right = world.predecessor[world.parent[lid]]
    wrong = next(g for g in [START, *world.predecessor] if g != right)
    assert math.isclose(gain(1, right, lid) - gain(1, wrong, lid), 0.5)
    failing = next(iter(task.family.fails))
    assert sim.outcome(world, task, 1, START, failing, 0, 0.0) == ("compile_error", None)
    assert len({world.families[f].effects[lid] for f in range(8)}) == 8  # families differ
    fresh = gain(3, wrong, lid)
    assert abs(gain(3, wrong, lid, times=2)) < abs(fresh)
    assert abs(gain(3, wrong, lid, best=3.0)) < abs(fresh)


# A kernel every CUDA direction has a fitting strategy for (the policy offers no other).
PROBE_TAGS = {"shared_memory", "loops", "nested_loops", "atomics", "half_precision",
              "multiple_kernels", "no_restrict", "scalar_loads", "no_launch_bounds"}  # fmt: skip


def _relative_log_odds(graph: Graph, world: Any, backend: str) -> list[float]:
    """log P(g | last = its right predecessor) - log mean P(g | last = another direction)."""

    def probability(last: str, g: str) -> float:
        decision = select_global(
            graph, [START, START, last], State(backend, "fused", "probe", PROBE_TAGS),
            PolicyConfig(), random.Random(0),
        )  # fmt: skip
        return next(c.probability for c in decision.candidates if c.id == g)

    out = []
    for g, pred in world.predecessor.items():
        if pred == START:
            continue
        others = [q for q in graph.globals if q not in (pred, g)]
        mean_other = sum(probability(q, g) for q in others) / len(others)
        out.append(math.log(probability(pred, g) / mean_other))
    return out


def _learned_shift(strength: float) -> list[float]:
    world = _world(strength=strength)
    tasks = sim.make_tasks(world, range(8), range(1000, 1150))
    _, learned = sim.run_arm("htam", world, tasks, 6, 1, None)
    seed = load_seed("cuda")
    return [
        a - b
        for a, b in zip(
            _relative_log_odds(learned, world, "cuda"),
            _relative_log_odds(seed, world, "cuda"),
            strict=True,
        )
    ]


def test_htam_learns_the_hidden_good_transitions() -> None:
    strong = _learned_shift(1.0)
    assert sum(d > 0 for d in strong) > len(strong) / 2
    assert sum(strong) / len(strong) > 0
    # Control: with no hidden transition effect, the good successors gain less.
    assert sum(strong) / len(strong) > sum(_learned_shift(0.0)) / len(strong)


def test_command_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--backends", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    arms = data["backends"]["cpu"]["comparison"]["arms"]
    assert set(arms) == set(sim.ARMS)
    for summary in arms.values():
        ci = summary["best_log"]
        assert ci["lo"] <= ci["mean"] <= ci["hi"]
        assert 0 <= summary["fast_rate"]["mean"] <= 1
    assert "| htam |" in done.stdout and data["markdown"] in done.stdout


def test_bad_backend_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--backends", "tpu"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr and "Traceback" not in done.stderr
