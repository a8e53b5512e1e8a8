"""Task loading and the binding of implementations to references."""

from pathlib import Path

import pytest

from htam_engine.errors import UserError
from htam_engine.task import TaskError, load_task

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
REFERENCE = (FIXTURES / "reference.py").read_text()
KERNEL = """#include <torch/extension.h>
torch::Tensor relu_forward(torch::Tensor x) { return x; }
"""


def test_python_directive_binds_reference():
    task = load_task(FIXTURES / "correct.py")
    assert task.reference_path == FIXTURES / "reference.py"
    assert task.reference_source == REFERENCE
    assert task.kind == "py" and task.backend == "cpu" and task.entry is None
    assert task.impl_source is not None and "ModelNew" in task.impl_source


def test_reference_alone_is_a_task_without_implementation():
    task = load_task(FIXTURES / "reference.py")
    assert task.impl_path is None and task.impl_source is None
    assert task.name == FIXTURES.name  # a generic reference stem names the folder instead


def test_task_is_named_after_its_reference():
    assert load_task(FIXTURES / "correct.py").name == FIXTURES.name


def test_cu_directive_with_entry(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "relu_ref.py").write_text(REFERENCE)
    kernel = tmp_path / "relu.cu"
    kernel.write_text("// htam: reference=ops/relu_ref.py entry=relu_forward\n" + KERNEL)
    task = load_task(kernel)
    assert task.kind == "cu" and task.backend == "cuda"
    assert task.entry == "relu_forward"
    assert task.reference_path == tmp_path / "ops" / "relu_ref.py"


def test_htam_toml_binding_found_walking_up(tmp_path):
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "htam.toml").write_text(
        '[[kernel]]\nfile = "src/k.cu"\nreference = "ref.py"\nentry = "relu_forward"\n'
    )
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "k.cu").write_text(KERNEL)
    task = load_task(tmp_path / "src" / "k.cu")
    assert task.entry == "relu_forward"
    assert task.reference_path.resolve() == (tmp_path / "ref.py").resolve()


def test_load_inline_cuda_candidate_is_guessed_cuda(tmp_path):
    (tmp_path / "reference.py").write_text(REFERENCE)
    impl = tmp_path / "impl.py"
    impl.write_text(
        "# htam: reference=reference.py\nfrom torch.utils.cpp_extension import load_inline\n"
        "mod = load_inline('x', cpp_sources='', cuda_sources='__global__ void k() {}')\n"
    )
    assert load_task(impl).backend == "cuda"


@pytest.mark.parametrize(
    ("files", "target", "message"),
    [
        ({"k.cu": KERNEL}, "k.cu", "not bound to a reference"),
        ({"k.py": "# htam: reference=missing.py\n"}, "k.py", "reference not found"),
        ({"k.py": "# htam: reference=r.py\n", "r.py": "def broken(:\n"}, "k.py", "does not parse"),
        ({"k.py": "# htam: reference=r.py\n", "r.py": "x = 1\n"}, "k.py", "missing Model"),
        ({"k.cu": "// htam: reference=r.py\n" + KERNEL, "r.py": REFERENCE}, "k.cu", "entry="),
        ({}, "nothing.py", "task file not found"),
    ],
)
def test_bad_tasks_give_clear_user_errors(tmp_path, files, target, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(TaskError, match=message) as caught:
        load_task(tmp_path / target)
    assert isinstance(caught.value, UserError)
