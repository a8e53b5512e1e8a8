"""Are HTAM's decisions ones a strong model can act on? For each CPU example, two real
KernelBench problems (started from a capable model's recorded translation,
../shared/data/llm-answers/frontier) and the KernelBench fixtures, this prints the first
3 choice prompts' candidate sets and the generation prompts' facts, and counts:

- offered strategies that do not fit the kernel by their own declarations
  (`LocalNode.fits` of THIS checkout's seed, on the family and the syntax-tree features
  of THIS checkout's parser), target 0;
- facts missing from each generation prompt (machine, ISA, caches, thread policy,
  tolerance, checks, shapes, parameter sync, PyTorch's time, the start's time, earlier
  attempts) and feedback that says "slower" of a step faster than the start.

    python benchmarks/decisions.py [--before OTHER_CHECKOUT] [--json]

`--before` names another checkout (e.g. main): its engine makes the prompts in a child
process (`--collect`), judged here with this checkout's declarations, next to this
checkout's own (a checkout whose `Optimizer` has the same public seams: `plan`,
`implement`, `learn`). The loop's real pieces make the prompts (`Optimizer.plan` with the
LLM selector, `Optimizer.implement`); no kernel is compiled or timed: every step is
answered "correct, 1.5x over the start, refused against the best (1.05x, 95 %
0.96-1.21)", and the answerer picks the first valid id.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FRONTIER = ROOT.parent / "shared" / "data" / "llm-answers" / "frontier"
FRONTIER_TASKS = ("gelu_bare.jsonl", "gemm_add_relu_bare.jsonl")
STEPS = 3
FENCE = re.compile(r"```python\n(.*?)\n```", re.S)


# --- the child: one checkout's prompts ------------------------------------------------


def _collect() -> dict[str, Any]:
    """Prompts of this process's engine (whatever PYTHONPATH points to)."""
    examples = sorted((ROOT / "examples").glob("*/cpu_naive.py"))
    tasks: list[tuple[str, Path]] = [(p.parent.name, p) for p in examples]
    work = Path(tempfile.mkdtemp(prefix="htam-decisions-"))
    for name in FRONTIER_TASKS:
        start = _frontier_start(FRONTIER / name, work / name.removesuffix(".jsonl"))
        if start is not None:
            tasks.append((f"kb:{name.removesuffix('.jsonl')}", start))
    try:
        found = {name: _run_task(path) for name, path in tasks}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fixtures = sorted((ROOT / "tests" / "fixtures" / "kernelbench").glob("level*/*.py"))
    translations = {p.stem: _translation_prompt(p) for p in fixtures}
    return {"tasks": found, "translations": translations}


def _frontier_start(cassette: Path, folder: Path) -> Path | None:
    """The reference and the recorded first translation of a bare KernelBench problem."""
    if not cassette.is_file():
        return None
    for line in cassette.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("purpose") == "translate":
            reference, code = FENCE.findall(entry["prompt"]), FENCE.findall(entry["text"])
            if reference and code:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "reference.py").write_text(reference[0] + "\n")
                start = folder / "start.py"
                start.write_text(f"# htam: reference=reference.py\n{code[-1]}\n")
                return start
    return None


def _translation_prompt(path: Path) -> str:
    from htam_engine import implement
    from htam_engine.task import load_task

    task = load_task(path)
    system, prompt = implement.first_version_prompt(task, implement.facts(task, None, None, 0))
    return f"{system}\n{prompt}"


def _answerer() -> Any:
    """A provider that records every prompt; a choice names the first valid id, a
    generation is not answered (the step's prompt is all we want)."""
    from htam_engine.llm.base import Completion, LLMError, Provider

    class Captured(LLMError):
        pass

    class Recorder(Provider):
        name = "bench"
        model = "first-valid-id"

        def __init__(self) -> None:
            super().__init__()
            self.prompts: list[tuple[str, str]] = []

        def _complete(self, request: Any) -> Completion:
            self.prompts.append((request.purpose, f"{request.system}\n{request.prompt}"))
            if request.purpose != "local":
                raise Captured("prompt captured")
            ids = re.search(r"^Valid ids: (.*)$", request.prompt, re.M)
            first = ids.group(1).split(",")[0].strip() if ids else ""
            text = json.dumps({"local": first, "reason": "first valid id"})
            return Completion(text, 0, 0, 0.0, False, 0.0, form="text")

    return Recorder(), Captured


def _verdicts() -> tuple[Any, Any, Any]:
    from htam_engine.evaluate import Duel, Verdict

    start = Verdict(compiled=True, correct=True, runtime_ms=3.0, ref_runtime_ms=1.0,
                    speedup=1 / 3, converged=True, sandbox="bwrap", threads=1)  # fmt: skip
    step = Verdict(compiled=True, correct=True, runtime_ms=2.0, ref_runtime_ms=1.0,
                   speedup=0.5, converged=True, sandbox="bwrap", threads=1)  # fmt: skip
    return start, step, Duel(1.05, 0.96, 1.21, False, 1)


def _run_task(path: Path) -> dict[str, Any]:
    from htam_engine import loop
    from htam_engine.events import Step
    from htam_engine.memory import MemoryStore
    from htam_engine.referee import Version
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    task = load_task(path)
    provider, captured = _answerer()
    source, config = task.impl_source or "", loop.LoopConfig(steps=STEPS)
    optimizer = loop.Optimizer(task, source, provider=provider, store=MemoryStore(),
                               config=config)  # fmt: skip
    start, verdict, duel = _verdicts()
    optimizer.begin(Version(source, 0, start))
    choices, generations = [], []
    for number in range(1, STEPS + 1):
        seen = len(provider.prompts)
        plan = optimizer.plan(number)
        if plan is None:
            break
        decision = plan.decision
        prompt = next((p for purpose, p in provider.prompts[seen:] if purpose == "local"), "")
        ids = re.search(r"^Valid ids: (.*)$", prompt, re.M)
        offered = [i.strip() for i in ids.group(1).split(",")] if ids else []
        choices.append({"global": decision.global_id, "local": decision.local_id,
                        "offered": offered, "prompt": prompt})  # fmt: skip
        if decision.local_id == "stop":
            break
        if not plan.node.mechanical:
            seen = len(provider.prompts)
            try:
                optimizer.implement(number, plan)
            except captured:
                generations.append(provider.prompts[seen][1])
        optimizer.runnable.tried.add((decision.local_id, plan.current.source))
        optimizer.learn(decision, Status.NOT_IMPROVED, verdict, 1.05, None)
        optimizer.steps.append(Step(number, decision.global_id, decision.local_id, "bench",
                                    Status.NOT_IMPROVED, 0.0, 1.5, verdict=verdict,
                                    versus_best=duel))  # fmt: skip
    return {"family": optimizer.episode.family, "start": optimizer.referee.best.source,
            "choices": choices, "generations": generations}  # fmt: skip


# --- the parent: judge with this checkout's declarations -------------------------------

FACTS = {
    "cpu model": lambda p, m: m.cpu in p,
    "ISA": lambda p, m: bool(re.search(r"^ISA: .*avx", p, re.M | re.I)),
    "cores": lambda p, m: bool(re.search(r"\d+ cores", p)),
    "caches": lambda p, m: "L1d" in p or "L2 " in p,
    "thread policy": lambda p, m: bool(re.search(r"(one|1) thread", p)),
    "tolerance": lambda p, m: "1e-4" in p,
    "checks": lambda p, m: "cheating" in p and "not_custom_kernel" in p,
    "shapes": lambda p, m: bool(re.search(r"float32\[\d", p)),
    "param sync": lambda p, m: "manual_seed" in p,
    "PyTorch time": lambda p, m: bool(re.search(r"PyTorch\b[^\n]*\d ms", p)),
    "start time": lambda p, m: bool(re.search(r"start\w*[^\n]*\d ms", p)),
}
ATTEMPTS = lambda p: bool(re.search(r"step 1 \S+: not_improved[^\n]*over the best", p))  # noqa: E731


def judge(collected: dict[str, Any]) -> dict[str, Any]:
    from htam_engine import machine, parsing
    from htam_engine.memory import load_seed
    from htam_engine.state import State

    graph = load_seed("cpu")
    facts = machine.cpu_facts()
    rows = []
    for name, task in collected["tasks"].items():
        tags = parsing.features(task["start"], "cpu")
        state = State("cpu", task["family"], name, features=tags)
        misfits, offered = [], 0
        for choice in task["choices"][:3]:
            for lid in choice["offered"]:
                node = graph.locals.get(lid)
                offered += lid != "stop"
                why = node.fits(state.family, state.tags()) if node else None
                if why:
                    misfits.append(f"{lid} ({why})")
        missing: dict[str, int] = {}
        for number, prompt in enumerate(task["generations"]):
            for fact, present in FACTS.items():
                missing[fact] = missing.get(fact, 0) + (not present(prompt, facts))
            if number:
                missing["earlier attempts"] = missing.get("earlier attempts", 0) + (
                    not ATTEMPTS(prompt)
                )
        slower = sum("slower" in c["prompt"] for c in task["choices"])
        rows.append({"task": name, "family": task["family"], "offered": offered,
                     "misfits": misfits, "generations": len(task["generations"]),
                     "missing": missing, "slower_said": slower,
                     "path": [f"{c['global']}/{c['local']}" for c in task["choices"]],
                     "sets": [c["offered"] for c in task["choices"]]})  # fmt: skip
    translate_missing = {
        stem: [f for f, present in FACTS.items() if not present(prompt, facts)]
        for stem, prompt in collected["translations"].items()
    }
    return {"rows": rows, "translations": translate_missing}


def _child(checkout: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="htam-decisions-home-") as home:
        env = {**os.environ, "PYTHONPATH": str(checkout), "HTAM_HOME": home}
        done = subprocess.run([sys.executable, __file__, "--collect"], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=1800, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"collecting with {checkout} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _summary(label: str, judged: dict[str, Any]) -> list[str]:
    rows = judged["rows"]
    head = "| task | family | offered | misfits | gen prompts | facts missing | 'slower' | path |"
    lines = [f"## {label}", head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['family']} | {r['offered']} | {len(r['misfits'])} | "
            f"{r['generations']} | {sum(r['missing'].values())} | {r['slower_said']} | "
            f"{'; '.join(r['path'])} |"
        )
    misfits = sum(len(r["misfits"]) for r in rows)
    offered = sum(r["offered"] for r in rows)
    gens = sum(r["generations"] for r in rows)
    missing = sum(sum(r["missing"].values()) for r in rows)
    per_fact: dict[str, int] = {}
    for r in rows:
        for fact, count in r["missing"].items():
            per_fact[fact] = per_fact.get(fact, 0) + count
    translate = judged["translations"]
    lines += [
        f"total: {misfits} of {offered} offered strategies do not fit; "
        f"{missing} facts missing over {gens} generation prompts "
        f"({', '.join(f'{k} {v}/{gens}' for k, v in per_fact.items() if v) or 'none'}); "
        f"'slower' said {sum(r['slower_said'] for r in rows)} times",
        f"translation prompts ({len(translate)} KernelBench fixtures): "
        f"{sum(map(len, translate.values()))} facts missing",
    ]
    for r in rows:
        for misfit in r["misfits"][:4]:
            lines.append(f"  {r['task']}: offered {misfit}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/decisions.py")
    parser.add_argument("--before", type=Path, help="another checkout to compare (e.g. main)")
    parser.add_argument("--collect", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.collect:
        print(json.dumps(_collect()))
        return 0
    results = {"after": judge(_child(ROOT))}
    if args.before:
        results = {"before": judge(_child(args.before.resolve())), **results}
    if args.json:
        print(json.dumps(results))
        return 0
    for label, judged in results.items():
        print("\n".join(_summary(f"{label}", judged)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
