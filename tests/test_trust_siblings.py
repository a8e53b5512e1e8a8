"""Files next to the candidate that it names are in its box, read-only; links, files
it does not name and large files are not."""

import pytest
from helpers.candidates import CANDIDATES, FIXTURES, QUICK, failed, sandboxed

from htam_engine.evaluate import Limits, evaluate, sandbox
from htam_engine.task import load_task


def test_only_named_plain_source_files_are_taken(tmp_path):
    candidate = tmp_path / "kernel.py"
    candidate.write_text('load("x", sources=["a.cpp", "b.h", "secret.h", "notes.txt"])')
    (tmp_path / "a.cpp").write_text("int a;")
    (tmp_path / "b.h").write_text("int b;")
    (tmp_path / "notes.txt").write_text("not a source")
    (tmp_path / "unnamed.cpp").write_text("int c;")
    outside = tmp_path.parent / f"{tmp_path.name}-key"
    outside.write_text("sk-test")
    (tmp_path / "secret.h").symlink_to(outside)
    (tmp_path / "big.h").write_text("x" * (sandbox.MAX_SIBLING_BYTES + 1))
    candidate.write_text(candidate.read_text() + " # big.h")
    found = sandbox.named_siblings(candidate, candidate.read_text())
    assert found == {"a.cpp": "int a;", "b.h": "int b;"}
    box = tmp_path / "box"
    box.mkdir()
    sandbox.place_siblings(found, box)
    assert (box / "a.cpp").read_text() == "int a;"
    assert not (box / "a.cpp").stat().st_mode & 0o222


@pytest.mark.slow
def test_cpp_extension_load_of_a_sibling_cpp_is_accepted():
    path = CANDIDATES / "honest" / "sibling_load.py"
    limits = Limits(compile_s=600, verify_s=60, time_s=60)  # a torch extension: ~1 min
    verdict = evaluate(load_task(path), path.read_text(), device="cpu", limits=limits)
    assert verdict.error is None and verdict.correct, verdict.error
    assert not failed(verdict)


# A kernel that includes its sibling `a.h` and names `b.h` (so a box holds both, where
# they exist). In the first folder `a.h` holds NULs: its comment line goes on past them,
# and the lines after them make the kernel right. In the second, `a.h` ends at the first
# NUL (every output 0) and `b.h` holds the rest, never included. The old keys joined
# `name NUL text` by NUL: both folders were one content, one verdict and one build.
SIBLING_HEADER = r'''# htam: reference=reference.py
import ctypes

import torch

from htam_engine.kernels import load_cpp

cpp_source = r"""
#include "a.h"
// b.h
extern "C" void relu(const float* x, float* y, long n) {
    for (long i = 0; i < n; ++i) y[i] = OUT(x[i]);
}
"""
_lib = load_cpp("relu_header", cpp_source, extra_cflags=["-O2", "-iquote", "candidate"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.relu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), x.numel())
        return y
'''
ZERO = "#define OUT(v) 0.0f\n//"
RIGHT = "\n#undef OUT\n#define OUT(v) ((v) > 0.0f ? (v) : 0.0f)\n"


def _folder(root, siblings):
    root.mkdir()
    (root / "reference.py").write_text((FIXTURES / "eval" / "reference.py").read_text())
    (root / "kernel.py").write_text(SIBLING_HEADER)
    for name, text in siblings.items():
        (root / name).write_text(text)
    return root / "kernel.py"


@pytest.mark.slow
def test_a_folder_never_gets_the_verdict_or_the_build_of_another(tmp_path, monkeypatch):
    right = _folder(tmp_path / "right", {"a.h": f"{ZERO}\0b.h\0{RIGHT}"})
    wrong = _folder(tmp_path / "wrong", {"a.h": ZERO, "b.h": RIGHT})
    with sandboxed("bwrap", monkeypatch):  # builds are kept only inside the sandbox

        def evaluated(path, **options):
            return evaluate(load_task(path), SIBLING_HEADER, device="cpu", limits=QUICK, **options)

        first = evaluated(right)
        assert first.correct and first.builds == {"candidate": "kept"}, first.error
        cached = evaluated(wrong)
        assert not cached.cached and cached.builds != {"candidate": "reused"}
        assert cached.error is not None and cached.error.kind == "incorrect", cached.error
        assert evaluated(right, use_cache=False).builds == {"candidate": "reused"}
        fresh = evaluated(wrong, use_cache=False)
        assert fresh.builds != {"candidate": "reused"}
        assert fresh.error is not None and fresh.error.kind == "incorrect", fresh.error
