"""Sizes: a problem at KernelBench's real size (19_ReLU: a 6.4 GB input) is refused before
anything runs, with the estimate, the limit and a `--scale` that fits; scaled, it runs and
the verdict says it was scaled. The judge that sizes a problem says what it could not size,
and the sweep hands the policy and the scale to every problem."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from htam_engine import sweep
from htam_engine.errors import UserError
from htam_engine.evaluate import runner, sizes, standby
from htam_engine.evaluate.protocol import Sized
from htam_engine.llm import facts
from htam_engine.paths import subdir
from htam_engine.task import Task, load_task, scale_reference, with_policy

FIXTURES = Path(__file__).parent / "fixtures" / "sizes"
KERNEL = FIXTURES / "relu_kernel.py"


def _eval(*flags: str) -> dict:
    argv = [sys.executable, "-m", "htam_engine.cli", "eval", str(KERNEL), str(KERNEL)]
    done = subprocess.run(
        [*argv, "--device", "cpu", "--json", *flags], capture_output=True, text=True, timeout=300
    )
    return json.loads(done.stdout)


def test_a_full_size_problem_is_refused_with_the_estimate_and_a_scale(htam_home: Path) -> None:
    error = _eval()["error"]
    assert error["kind"] == "too_large"
    assert "one input set is 6.4 GB" in error["message"]
    assert "Limits.memory_mb" in error["message"]
    # 0.1 fits under the worker's cap; a busy machine's free memory may ask for less
    suggested = re.search(r"--scale (\S+) ", error["message"])
    assert suggested and 0 < float(suggested.group(1)) <= 0.1, error["message"]
    assert "batch_size" in error["message"]
    # the judge started beside the estimate (held: no input set made) went with the command
    assert not list((htam_home / "jobs").glob("*"))


def test_scaled_down_it_runs_and_the_verdict_says_so() -> None:
    verdict = _eval("--scale", "0.001")
    assert verdict["error"] is None, verdict["error"]
    assert verdict["correct"]
    assert verdict["scaled"] == {"factor": 0.001, "sizes": {"batch_size": [4096, 4]}}


FIXED = "[torch.randn(64, 256)]"


@pytest.fixture
def spare() -> Iterator[None]:
    try:
        yield
    finally:
        standby._SPARE.release()


def _problem(
    tmp_path: Path, inputs: str = FIXED, forward: str = "torch.relu(x)", top: str = ""
) -> Task:
    path = tmp_path / "reference.py"
    path.write_text(
        f"{top}import torch\n\n\nclass Model(torch.nn.Module):\n"
        f"    def forward(self, x):\n        return {forward}\n\n\n"
        f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return load_task(path)


def test_the_judge_a_warm_process_started_sizes_its_problem_before_its_job(
    tmp_path: Path, spare: None
) -> None:
    """The language server's process started ahead (`htam_engine.warm`) has a judge that
    prepared its inputs: asked, it still sizes the problem, and is the one to serve it."""
    task = _problem(tmp_path)
    runner.start_ahead(task, "cpu")
    ahead = standby._SPARE.started
    assert ahead is not None
    sized = Sized(64 * 256 * 4, 64 * 256 * 4, shapes=["float32[64, 256]"])
    assert runner.size_problem(task, "cpu") == sized
    assert standby._SPARE.started is ahead and ahead.judge.popen.poll() is None


def test_each_input_is_named_by_the_judge_however_get_inputs_builds_it(
    tmp_path: Path, spare: None
) -> None:
    """A prompt's input shapes come from the judge's meta-tensor sizing: the reference
    read statically cannot tell an input built by a chain of calls (`x0: unknown`)."""
    task = _problem(tmp_path, inputs="[torch.randn(8, 2 * 8).abs()]")
    assert "x0: unknown" in facts.task_text(task.reference_source)
    shapes = sizes.estimate(task, "cpu").shapes
    assert shapes == ("float32[8, 16]",)
    assert "x0: float32[8, 16]" in facts.task_text(task.reference_source, shapes)
    assert sizes.estimate(task, "cpu").shapes == shapes  # kept by content


@pytest.mark.parametrize(
    ("code", "inputs", "outputs", "why"),
    [
        ({"inputs": "[torch.randn(int(torch.randint(60, 70, ()).item()))]"}, None, None,
         "no estimate: the reference does not run on meta tensors"),
        ({"forward": "x * x.abs().max().item()"}, 64 * 256 * 4, None, "outputs unknown"),
        ({"top": "import os\nos._exit(3)\n"}, None, None,
         "no estimate: the judge failed during sizing"),
    ],
    ids=["sizes-from-data", "forward-needs-values", "judge-killed"],
)  # fmt: skip
def test_what_the_judge_cannot_size_stays_unknown_and_says_why(
    tmp_path: Path, spare: None, code: dict, inputs: int | None, outputs: int | None, why: str
) -> None:
    """Nothing is refused on a guess: a size meta tensors cannot give is None with the
    reason, and a judge the reference killed is gone with its folder."""
    sized = runner.size_problem(_problem(tmp_path, **code), "cpu")
    assert (sized.inputs, sized.outputs) == (inputs, outputs)
    assert sized.why.startswith(why), sized.why
    alive = standby._SPARE.started is not None
    assert alive == (code.get("top") is None), "the judge that sized it waits for its job"
    assert alive or not any(subdir("jobs").iterdir()), "a killed judge's folder is gone"


def test_scale_shrinks_only_batch_like_module_sizes() -> None:
    source = "batch_size = 1024 * 4\ndim = 4096\nN = 7  # rows\nM: int = 9\ndef f():\n    N = 5\n"
    scaled, changed = scale_reference(source, 0.5)
    assert changed == (("batch_size", 4096, 2048), ("N", 7, 3))
    assert "dim = 4096" in scaled and "    N = 5" in scaled
    assert "batch_size = 2048  # htam --scale 0.5: was 4096" in scaled
    assert scale_reference("N = 1\n", 0.01)[1] == (("N", 1, 1),)  # never below 1
    task = load_task(KERNEL)
    with pytest.raises(UserError, match="--scale"):
        with_policy(task, scale=1.5)
    with pytest.raises(UserError, match="no module-level size"):
        with_policy(
            load_task(Path(__file__).parent / "fixtures" / "eval" / "correct.py"), scale=0.5
        )


def test_the_sweep_passes_the_policy_and_the_scale_to_each_problem() -> None:
    args = argparse.Namespace(
        steps=1, provider="offline", device="cpu", model=None, base_url=None, cassette=None,
        allow_torch="gemm, conv", scale=0.25,
    )  # fmt: skip
    argv = sweep.optimize_argv(args)
    assert argv[argv.index("--allow-torch") + 1] == "gemm,conv"
    assert argv[argv.index("--scale") + 1] == "0.25"
    args.allow_torch = "mm;rm -rf"
    with pytest.raises(UserError, match="--allow-torch"):
        sweep.optimize_argv(args)
