"""Static anti-cheat checks and error excerpts (no processes)."""

from pathlib import Path

import pytest

from htam_engine.evaluate.excerpt import around, line_from_log
from htam_engine.evaluate.static import static_checks

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
REPO = Path(__file__).resolve().parent.parent
REFERENCE = (FIXTURES / "reference.py").read_text()


def failed(name: str) -> list[str]:
    return failed_source((FIXTURES / name).read_text())


def failed_source(source: str) -> list[str]:
    return [check.name for check in static_checks(source, "py", REFERENCE) if not check.passed]


def test_honest_candidate_passes_every_static_check():
    assert failed("correct.py") == []


@pytest.mark.parametrize(
    ("fixture", "check"),
    [
        ("cheats/torch_fallback.py", "static.torch_compute"),
        ("cheats/try_except.py", "static.try_except"),
        ("cheats/caller_frames.py", "static.frame_inspection"),
        ("cheats/downcast.py", "static.precision_downcast"),
        ("cheats/lazy_subclass.py", "static.tensor_subclass"),
        ("cheats/monkeypatch_compare.py", "static.monkeypatch"),
    ],
)
def test_static_check_names_the_hack(fixture, check):
    assert check in failed(fixture)


def test_torch_modules_may_build_parameters_in_init_but_not_compute():
    """KernelBench candidates build weights as the reference does (same seed, same values)."""
    source = (REPO / "examples" / "linear_relu" / "cpu_naive.py").read_text()
    assert "nn.Linear(" in source
    assert "static.torch_compute" not in failed_source(source)
    computing = source.replace(
        "def forward(self, x: torch.Tensor) -> torch.Tensor:",
        "def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        return torch.relu(self.linear(x))",
    )
    assert "static.torch_compute" in failed_source(computing)


def test_broadcasting_in_forward_is_no_computation():
    """A capable model's first KL divergence and hinge loss broadcast their inputs before
    the kernel (`torch.broadcast_tensors`, `torch.broadcast_shapes`): views and shapes,
    which the prompt now names as allowed; both first versions were refused."""
    source = (REPO / "examples" / "linear_relu" / "cpu_naive.py").read_text()
    broadcasting = source.replace(
        "def forward(self, x: torch.Tensor) -> torch.Tensor:",
        "def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        shape = torch.broadcast_shapes(x.shape, x.shape)\n"
        "        x, _ = torch.broadcast_tensors(x, torch.broadcast_to(x, shape))",
    )
    assert broadcasting != source
    assert "static.torch_compute" not in failed_source(broadcasting)


def test_reference_use_and_side_streams_are_flagged():
    source = (
        "import torch\nfrom reference import Model\nclass ModelNew(Model):\n"
        "    def forward(self, x):\n        s = torch.cuda.Stream()\n        return x\n"
    )
    names = [c.name for c in static_checks(source, "py", REFERENCE) if not c.passed]
    assert "static.reference_fallback" in names and "static.threads_streams" in names


def test_compiler_error_maps_to_the_users_line():
    source = 'x = 1\ncode = r"""\nint f() {\n  return undefined_name;\n}\n"""\n'
    log = (
        "/tmp/b/kernel.cpp:3:10: error: 'undefined_name' was not declared in this scope\n"
        "    3 |   return undefined_name;\n      |          ^~~~~~~~~~~~~~\n"
    )
    assert line_from_log(log, source) == 4
    assert around(source, 4).splitlines()[2] == ">    4 |   return undefined_name;"
