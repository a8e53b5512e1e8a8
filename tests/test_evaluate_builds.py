"""The trusted build cache (`evaluate.builds`): a re-evaluation of the same content reuses
its own build, other content never does, a box cannot write an entry, and no failed
build is kept. A build is kept once its candidate passed verification (what its timing
says, e.g. a thread flagged on a loaded machine, does not matter to the build)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.candidates import QUICK, measure, sandboxed

from htam_engine import kernels
from htam_engine.evaluate import builds
from htam_engine.evaluate.runner import run_candidate
from htam_engine.evaluate.verdict import Verdict
from htam_engine.paths import subdir
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
CORRECT = FIXTURES / "correct.py"


@pytest.fixture
def bwrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with sandboxed("bwrap", monkeypatch):
        yield


def entries() -> dict[str, dict[str, str]]:
    """Each kept entry's files (relative path -> sha256), links marked."""
    found = {}
    for entry in sorted(subdir("box-builds").iterdir()):
        if entry.name.startswith("."):
            continue
        found[entry.name] = {
            str(p.relative_to(entry)): "link" if p.is_symlink() else _digest(p)
            for p in entry.rglob("*")
            if p.is_symlink() or p.is_file()
        }
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def evaluate(path: Path, source: str | None = None) -> Verdict:
    return measure(path, source, QUICK)


@pytest.mark.slow
def test_a_build_reaches_only_evaluations_of_its_own_content(bwrap: None) -> None:
    first = evaluate(CORRECT)
    assert first.builds == {"candidate": "kept"}, first.error
    kept = entries()
    (key,) = kept
    (library,) = [name for name in kept[key] if name.endswith(".so")]  # and its vectorizer report
    again = evaluate(CORRECT)
    assert again.builds == {"candidate": "reused"}, again.error
    assert entries() == kept, "a hit adds nothing"
    other_source = CORRECT.read_text() + "\n# another content\n"
    other = evaluate(CORRECT, other_source)
    assert other.builds == {"candidate": "kept"}, other.error
    duel = run_candidate(  # a duel against the best: both sides are known content
        load_task(CORRECT), other_source, Verdict(device="cpu", sandbox="bwrap"), QUICK,
        threading.Event(), lambda _phase: None, incumbent=CORRECT.read_text(),
    )  # fmt: skip
    assert duel.builds == {"candidate": "reused", "incumbent": "reused"}, duel.error

    # A poisoned entry (the library of a wrong kernel under the same name) reaches only
    # the content it was kept for: proof that a hit loads the kept build, not a new one.
    wrong_source = (FIXTURES / "incorrect.py").read_text().split('r"""')[1].split('"""')[0]
    wrong = kernels.build_cpp(wrong_source)
    (subdir("box-builds") / key / library).chmod(0o644)
    (subdir("box-builds") / key / library).write_bytes(wrong.read_bytes())
    other = evaluate(CORRECT, other_source)
    assert other.builds == {"candidate": "reused"} and other.inputs_checked, other.error
    assert other.error is None or other.error.kind != "incorrect", other.error
    poisoned = evaluate(CORRECT)
    assert poisoned.builds == {"candidate": "reused"}
    assert poisoned.error is not None and poisoned.error.kind == "incorrect"
    assert key not in entries(), "an entry whose evaluation failed is forgotten"
    healed = evaluate(CORRECT)
    assert healed.builds == {"candidate": "kept"}, healed.error


@pytest.mark.slow
@pytest.mark.parametrize("name", ["no_compile.py", "incorrect.py"])
def test_a_failed_build_is_never_kept(bwrap: None, name: str) -> None:
    verdict = evaluate(FIXTURES / name)
    assert verdict.error is not None and verdict.builds == {}
    assert entries() == {}
    assert not list(subdir("box-builds").iterdir()), "no staging copy is left either"


# Correct, and at load it tries to write the entry of the content evaluated before it
# (its path given here, as a candidate could guess it) and plants a link and a special
# name in its own build folder.
INTRUDER = """
import os, pathlib
for target in {targets!r}:
    try:
        pathlib.Path(target).write_bytes(b"poison")
    except OSError:
        pass
build = pathlib.Path(os.environ["HOME"]) / "build"
os.symlink("/etc/hostname", build / "leak")
os.symlink("/etc", build / "tree")
os.mkfifo(build / "pipe")
"""


@pytest.mark.slow
def test_a_candidate_cannot_write_another_keys_entry(bwrap: None) -> None:
    assert evaluate(CORRECT).builds == {"candidate": "kept"}
    before = entries()
    (key,) = before
    targets = [str(subdir("box-builds") / key / name) for name in before[key]]
    targets.append(str(subdir("box-builds") / key / "extra.so"))
    source = CORRECT.read_text() + INTRUDER.format(targets=targets)
    intruder = evaluate(CORRECT, source)
    assert intruder.builds == {"candidate": "kept"}, intruder.error
    after = entries()
    assert after[key] == before[key], "the other entry is untouched"
    (own,) = set(after) - {key}
    assert set(after[own]) == set(before[key]), "only its own library, no link, no pipe"


def test_without_the_sandbox_nothing_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without bwrap a candidate can reach the HTAM home: no entry may be trusted."""
    with sandboxed("none", monkeypatch):
        assert not builds.enabled()


def test_the_key_holds_what_the_build_depends_on(monkeypatch: pytest.MonkeyPatch) -> None:
    base = builds.key("k.py", "code", {"a.cpp": "int a;"}, "cpu")
    assert base == builds.key("k.py", "code", {"a.cpp": "int a;"}, "cpu")
    changed = [
        builds.key("k.py", "code ", {"a.cpp": "int a;"}, "cpu"),
        builds.key("j.py", "code", {"a.cpp": "int a;"}, "cpu"),
        builds.key("k.py", "code", {"a.cpp": "int b;"}, "cpu"),
        builds.key("k.py", "code", {}, "cpu"),
        builds.key("k.py", "code", {"a.cpp": "int a;"}, "cuda"),
    ]
    monkeypatch.setenv("CXX", "clang++")
    changed.append(builds.key("k.py", "code", {"a.cpp": "int a;"}, "cpu"))
    assert base not in changed and len(set(changed)) == len(changed)


def test_two_folders_whose_joined_siblings_were_one_string_have_two_keys() -> None:
    """The old key joined `name NUL text` by NUL: a header holding NULs passed for two."""
    one_header, two_headers = {"a.h": "x\0b.h\0y"}, {"a.h": "x", "b.h": "y"}
    joined = ["\0".join(f"{n}\0{t}" for n, t in s.items()) for s in (one_header, two_headers)]
    assert joined[0] == joined[1], "the pair collided under the old key"
    assert builds.key("k.py", "code", one_header, "cpu") != builds.key(
        "k.py", "code", two_headers, "cpu"
    )
    assert builds.key("k.py", "code\0a.h\0x", {}, "cpu") != builds.key(
        "k.py", "code", {"a.h": "x"}, "cpu"
    )


def _entry(key: str, size: int, mtime: float) -> None:
    folder = subdir("box-builds") / key
    folder.mkdir()
    (folder / "lib.so").write_bytes(b"x" * size)
    os.utime(folder, (mtime, mtime))


def test_eviction_removes_the_least_recently_used_entries_first() -> None:
    for number, key in enumerate(["old", "middle", "new"]):
        _entry(key, 1000, 1_000_000 + number)
    assert builds.evict(limit=2500) == ["old"]
    assert builds.evict(limit=900) == ["middle", "new"]
    assert entries() == {}


def test_a_build_folder_past_the_bounds_is_not_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "big.so").write_bytes(b"x" * 2048)
    monkeypatch.setattr(builds, "MAX_ENTRY_BYTES", 1024)
    box = builds.Box(folder, "k")
    box.stage()
    assert box.staged is None and not list(subdir("box-builds").iterdir())
    monkeypatch.setattr(builds, "MAX_ENTRY_BYTES", 4096)
    box.stage()
    assert box.keep() and entries() == {"k": {"big.so": _digest(folder / "big.so")}}
