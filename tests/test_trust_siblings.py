"""Files next to the candidate that it names are in its box, read-only; links, files
it does not name and large files are not."""

import pytest
from helpers.candidates import CANDIDATES, failed

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
