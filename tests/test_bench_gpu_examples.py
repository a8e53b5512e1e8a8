"""benchmarks/gpu_examples.py: skips cleanly without a GPU, says what it lacks on a GPU
machine without its packages, records commands relative to the repository, and on a GPU
measures correctness, speedups with intervals and the timing CV."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_examples.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_examples  # noqa: E402

NO_GPU = "reason" in gpu_examples.probe_gpu()


def run_script(
    tmp_path: Path, *args: str, timeout: int, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    return done, json.loads(out.read_text())


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_without_a_gpu_it_says_why_and_exits_zero(tmp_path: Path) -> None:
    done, data = run_script(tmp_path, "--quick", timeout=60)
    assert done.returncode == 0, done.stderr
    assert data["skipped"].startswith("no NVIDIA GPU on this machine")
    assert done.stdout.startswith("GPU section skipped:")
    assert str(REPO) not in json.dumps(data)
    assert data["invocation"].startswith("python benchmarks/gpu_examples.py --quick")


def fake_nvidia_smi(folder: Path) -> dict[str, str]:
    """A PATH on which `nvidia-smi` reports an H200 (the GPU machine's driver answer)."""
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA H200, 580.159.03'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(not NO_GPU, reason="pretends a GPU where torch has none")
def test_a_gpu_that_torch_cannot_use_is_blocked_with_the_reason(tmp_path: Path) -> None:
    done, data = run_script(tmp_path, timeout=120, env=fake_nvidia_smi(tmp_path / "bin"))
    assert done.returncode == 1
    assert "torch.cuda.is_available() is False" in data["blocked"]
    assert data["gpu"] == {
        "gpu": "NVIDIA H200",
        "driver": "580.159.03",
        "nvcc": data["gpu"]["nvcc"],
    }
    assert done.stdout.startswith("GPU section blocked:")


def test_missing_packages_are_named_with_the_command_that_fetches_them() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    needed = gpu_examples.needed_distributions(pyproject)
    assert "torch" in needed and "tree-sitter-cuda" in needed and "pytest" in needed
    assert "pygls" not in needed  # the language server's
    present = {"torch", "pytest", "rich"}
    missing = gpu_examples.missing_distributions(pyproject, lambda name: name in present)
    assert "torch" not in missing and "kernelguard" in missing
    command = gpu_examples.wheel_command(missing, "3.12")
    assert command.startswith("python3 -m pip download --no-deps --only-binary=:all:")
    assert "--python-version 3.12" in command and command.endswith(" ".join(missing))


def test_wheels_from_a_folder_without_wheels_are_reported(tmp_path: Path) -> None:
    assert gpu_examples.install_wheels(tmp_path) == f"no wheels in {tmp_path}"


def test_commands_are_recorded_relative_to_the_repository(tmp_path: Path) -> None:
    example = REPO / "examples" / "gelu" / "cuda_naive.py"
    argv = [sys.executable, "-m", "htam_engine.cli", "eval", str(example), str(tmp_path / "b.py")]
    assert gpu_examples.shown(argv, tmp_path) == (
        "python -m htam_engine.cli eval examples/gelu/cuda_naive.py $HTAM_HOME/b.py"
    )


def test_intervals_bracket_the_geometric_mean() -> None:
    assert gpu_examples.t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    cell = gpu_examples.log_interval([1.9, 2.0, 2.1, 2.0, 1.95])
    assert cell is not None and cell["n"] == 5
    assert cell["low"] < cell["geomean"] < cell["high"]
    wider = gpu_examples.log_interval([1.9, 2.0, 2.1, 2.0, 1.95], extra_log_se=0.05)
    assert wider is not None and wider["high"] - wider["low"] > cell["high"] - cell["low"]
    assert gpu_examples.log_interval([]) is None


def measured() -> dict[str, Any]:
    interval = {"geomean": 2.0, "low": 1.8, "high": 2.2, "n": 5}
    return {
        "environment": {"device": "NVIDIA H200", "capability": "sm_90", "driver": "580",
                        "cuda_runtime": "13.0", "nvcc": "release 13.0", "torch": "2.11"},
        "steps": 3, "seed": 0, "wall_s": 300.0,
        "gpu_tests": {"summary": "12 passed in 80s"},
        "runs": [
            {"example": "gelu", "correct": True, "speedup_over_start": interval,
             "speedup_over_pytorch": interval, "start_speedup_over_pytorch": 0.5,
             "runtime_cv": 0.012, "sandbox": ["bwrap"]},
            {"example": "matmul", "error": "timed out after 100 s"},
        ],
    }  # fmt: skip


def test_the_table_shows_intervals_cv_and_sandbox() -> None:
    table = gpu_examples.markdown(measured())
    assert (
        "| gelu | True | 2.00x [1.80, 2.20] | 2.00x [1.80, 2.20] | 0.50x | 1.2 % | bwrap |" in table
    )
    assert "| matmul | timed out after 100 s |" in table
    assert "`pytest -m gpu`: 12 passed in 80s." in table


def test_a_skipped_run_never_overwrites_a_measured_result(tmp_path: Path) -> None:
    path = tmp_path / "gpu_examples.json"
    gpu_examples.write({**measured(), "markdown": "table"}, path)
    assert path.with_suffix(".md").read_text() == "table\n"
    written = gpu_examples.write({"skipped": "no GPU", "markdown": "skipped"}, path)
    assert written == tmp_path / "gpu_examples.skipped.json"
    assert "runs" in json.loads(path.read_text())


@pytest.mark.gpu
def test_on_a_gpu_it_measures_speedup_and_timing_cv(tmp_path: Path) -> None:
    if NO_GPU:
        pytest.skip("needs an NVIDIA GPU")
    done, data = run_script(tmp_path, "--quick", "--steps", "1", "--budget-s", "300", timeout=480)
    assert done.returncode == 0, done.stderr
    assert data["wall_s"] < 400 and data["environment"]["device"]
    measured_runs = [r for r in data["runs"] if "error" not in r]
    assert measured_runs, data["runs"]
    for run in measured_runs:
        assert run["runtime_cv"] is None or run["runtime_cv"] >= 0
        assert run["sandbox"]
    assert "| runtime CV |" in done.stdout


def test_the_import_check_names_what_the_run_cannot_import() -> None:
    assert gpu_examples.unimportable() == []  # this venv has everything
    missing = gpu_examples.unimportable(("htam_engine.loop", "no_such_module_here"))
    assert missing == ["no-such-module-here"]


@pytest.mark.skipif(not NO_GPU, reason="pretends a GPU where torch has none")
def test_an_interpreter_without_the_packages_is_blocked_with_what_it_needs(
    tmp_path: Path,
) -> None:
    """The GPU machine's python is not this venv: a bare interpreter says what to carry."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [str(bare / "bin" / "python"), str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **fake_nvidia_smi(tmp_path / "bin")},
    )
    data = json.loads(out.read_text())
    assert done.returncode == 1, done.stderr
    assert data["blocked"].startswith("this interpreter cannot import")
    assert {"tree-sitter", "torch", "kernelguard", "pytest"} <= set(data["needs"])
    assert data["how"].startswith("python3 -m pip download") and "--wheels .whl" in data["how"]
