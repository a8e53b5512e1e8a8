"""The example tasks: each naive CPU start is correct against its PyTorch reference."""

from __future__ import annotations

import pytest
from helpers.examples import EXAMPLES, TASKS, assert_close, run_candidate

from htam_engine import parsing


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def test_examples_cover_the_four_families() -> None:
    families = {parsing.family((EXAMPLES / t / "reference.py").read_text()) for t in TASKS}
    assert families == {"elementwise", "reduction", "matmul", "fused"}


@pytest.mark.parametrize("task", TASKS)
def test_example_has_its_files(task: str) -> None:
    for name in ("reference.py", "cpu_naive.py", "cuda_naive.py"):
        source = (EXAMPLES / task / name).read_text()
        assert not parsing.has_errors(source, "python"), name
    cpu = (EXAMPLES / task / "cpu_naive.py").read_text()
    assert cpu.splitlines()[0] == "# htam: reference=reference.py"
    assert [e.call for e in parsing.embedded_sources(cpu)] == ["load_cpp"]


@pytest.mark.parametrize("task", TASKS)
def test_naive_cpu_start_is_correct(task: str) -> None:
    expected, actual = run_candidate(task, EXAMPLES / task / "cpu_naive.py")
    assert_close(expected, actual)
