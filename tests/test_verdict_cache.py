"""The verdict cache: answered only for its own key, evaluator and sandbox mode; rows are
JSON, never interpreted; and a verdict is a baseline only when it is clean and trusted."""

from __future__ import annotations

import ast
import json
import multiprocessing
import pickle
import sqlite3
from pathlib import Path

import pytest

from htam_engine.evaluate import cache
from htam_engine.evaluate.verdict import Check, EvalError, Limits, Verdict
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "eval"


@pytest.fixture
def home(htam_home: Path) -> Path:
    return htam_home


def clean(sandbox: str = "bwrap") -> Verdict:
    return Verdict(
        sandbox=sandbox,
        compiled=True,
        correct=True,
        runtime_ms=0.5,
        ref_runtime_ms=1.0,
        speedup=2.0,
        checks=[Check("output.values", True)],
        inputs_checked=3,
    )


def key_for(candidate: str, sandbox: str) -> str:
    task = load_task(FIXTURES / "correct.py")
    return cache.key(task, candidate, "cpu", Limits(), sandbox=sandbox)


# Two folders whose siblings the old key joined into one string, `name NUL text` joined by
# NUL: {"a.h": "x NUL b.h NUL y"} read exactly as {"a.h": "x", "b.h": "y"}.
ONE_HEADER = {"a.h": "x\0b.h\0y"}
TWO_HEADERS = {"a.h": "x", "b.h": "y"}


def test_two_folders_whose_joined_siblings_were_one_string_have_two_keys() -> None:
    joined = ["".join(f"\0{n}\0{t}" for n, t in s.items()) for s in (ONE_HEADER, TWO_HEADERS)]
    assert joined[0] == joined[1], "the pair collided under the old key"
    task = load_task(FIXTURES / "correct.py")
    one, two = (
        cache.key(task, cache.content("k", siblings=s), "cpu", Limits())
        for s in (ONE_HEADER, TWO_HEADERS)
    )
    assert one != two


def test_no_field_of_the_content_can_pass_for_another() -> None:
    """Each pair joined into the same string by a separator, or told apart only by where
    one field ends: every one has its own key."""
    task = load_task(FIXTURES / "correct.py")
    contents = [
        cache.content("a\0vs\0b"),
        cache.content("a", incumbent="b"),
        cache.content("a\0run\01"),
        cache.content("a", run=1),
        cache.content("a", incumbent="b\0run\01"),
        cache.content("a", incumbent="b", run=1),
        cache.content("a\0baseline\0compiled"),
        cache.content("a", baseline="compiled"),
        cache.content("a", siblings={"x.h": ""}),
        cache.content("a", siblings={"x.h\0": ""}),
        cache.content("a", siblings={"x.h": "\0"}),
    ]
    keys = {cache.key(task, content, "cpu", Limits()) for content in contents}
    assert len(keys) == len(contents)
    assert cache.key(task, "a", "cpu", Limits()) == cache.key(
        task, cache.content("a"), "cpu", Limits()
    ), "a bare source is its plain evaluation"


def rows(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "eval-cache" / cache.DB_NAME)


def test_the_evaluator_version_covers_every_module_of_htam_the_evaluator_imports() -> None:
    """A tolerance (`vocabulary`) or a stopping rule (`stats`) changed must miss the
    cache, as a check changed in the evaluator itself does."""
    package = Path(cache.__file__).parent
    imported = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "htam_engine":
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("htam_"):
                imported.add(str(node.module).split(".")[1])
    hashed = {path.stem for path in cache.evaluator_files()} | {"parsing", "evaluate"}
    assert imported - hashed == set()
    assert all(path.is_file() for path in cache.evaluator_files())


def test_a_record_answers_only_for_its_sandbox_mode() -> None:
    inside, outside = key_for("x", "bwrap"), key_for("x", "none")
    assert inside != outside
    cache.put(inside, clean(), sandbox="bwrap")
    hit = cache.get(inside, sandbox="bwrap")
    assert hit is not None and hit.cached and hit.speedup == 2.0
    assert cache.get(inside, sandbox="none") is None
    assert cache.get(outside, sandbox="none") is None


def test_the_record_keeps_the_conditions_of_the_measurement(home: Path) -> None:
    cache.put(key_for("x", "bwrap"), clean(), sandbox="bwrap")
    with rows(home) as db:
        (text,) = db.execute("SELECT record FROM verdicts").fetchone()
    record = json.loads(text)
    assert record["sandbox"] == "bwrap"
    assert record["evaluator"] == cache.evaluator_version()
    assert record["fingerprint"] == cache.fingerprint()
    assert record["verdict"]["speedup"] == 2.0


def test_a_verdict_from_another_evaluator_is_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache.evaluator_version() in cache.fingerprint()  # so in every key
    monkeypatch.setattr(cache, "fingerprint", lambda: "one environment")  # one key ...
    monkeypatch.setattr(cache, "evaluator_version", lambda: "0" * 16)
    entry = key_for("x", "bwrap")
    cache.put(entry, clean(), sandbox="bwrap")
    monkeypatch.setattr(cache, "evaluator_version", lambda: "1" * 16)
    assert key_for("x", "bwrap") == entry
    assert cache.get(entry, sandbox="bwrap") is None  # ... but the record names its evaluator


def test_a_record_copied_under_another_key_is_a_miss(home: Path) -> None:
    """A forged 'correct, 20x' for another file: the record names the key it was made for."""
    honest, target = key_for("honest", "bwrap"), key_for("the cheat", "bwrap")
    cache.put(honest, clean(), sandbox="bwrap")
    with rows(home) as db:
        (text,) = db.execute("SELECT record FROM verdicts").fetchone()
        db.execute("INSERT INTO verdicts VALUES (?, ?)", (target, text))
    assert cache.get(target, sandbox="bwrap") is None
    assert cache.get(honest, sandbox="bwrap") is not None


def test_a_row_that_is_not_json_is_never_interpreted(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    entry = key_for("x", "bwrap")
    cache.put(key_for("other", "bwrap"), clean(), sandbox="bwrap")  # creates the table

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (marker.touch, ())  # type: ignore[return-value]

    with rows(home) as db:
        db.execute("INSERT INTO verdicts VALUES (?, ?)", (entry, pickle.dumps(Payload())))
        db.execute("INSERT INTO verdicts VALUES (?, ?)", (key_for("y", "bwrap"), "{not json"))
    assert cache.get(entry, sandbox="bwrap") is None
    assert cache.get(key_for("y", "bwrap"), sandbox="bwrap") is None
    assert not marker.exists()


def test_a_damaged_cache_file_is_moved_aside_and_started_afresh(home: Path) -> None:
    folder = home / "eval-cache"
    folder.mkdir(parents=True)
    (folder / cache.DB_NAME).write_bytes(b"this is not a database" * 100)
    entry = key_for("x", "bwrap")
    assert cache.get(entry, sandbox="bwrap") is None
    cache.put(entry, clean(), sandbox="bwrap")
    assert cache.get(entry, sandbox="bwrap") is not None
    assert list(folder.glob(f"{cache.DB_NAME}.corrupt-*"))


def locked(path: Path) -> sqlite3.Connection:
    """A connection holding `path` exclusively: no other may even read it till it closes."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_a_busy_cache_is_waited_for_and_never_moved_aside(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking a lock for damage moved a live cache aside, and with it what other processes
    had just stored (CI, 2026-12-04: 4 writers at once, records lost)."""
    entry = key_for("x", "bwrap")
    cache.put(entry, clean(), sandbox="bwrap")
    monkeypatch.setattr(cache, "BUSY_TIMEOUT_S", 0.3)
    holder = locked(home / "eval-cache" / cache.DB_NAME)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        cache.get(entry, sandbox="bwrap")
    holder.close()
    assert not list((home / "eval-cache").glob("*corrupt*"))
    assert cache.get(entry, sandbox="bwrap") is not None


def suspect() -> Verdict:
    verdict = clean()
    verdict.speedup, verdict.suspect = 40.0, True
    return verdict


def cheating() -> Verdict:
    verdict = clean()
    verdict.correct = False
    verdict.error = EvalError("cheating", "static.monkeypatch: patches time.perf_counter")
    return verdict


def failed_check() -> Verdict:
    verdict = clean()
    verdict.checks.append(Check("timing.wall_clock", False, "samples exceed the wall time"))
    return verdict


def untimed() -> Verdict:
    verdict = clean()
    verdict.runtime_ms = verdict.speedup = None
    return verdict


@pytest.mark.parametrize("make", [suspect, cheating, failed_check, untimed])
def test_suspect_cheating_or_untimed_verdicts_are_never_a_baseline(make) -> None:
    verdict = make()
    assert not cache.usable_as_baseline(verdict)
    entry = key_for(make.__name__, "bwrap")
    cache.put(entry, verdict, sandbox="bwrap")
    assert cache.get(entry, sandbox="bwrap") is not None  # still shown, still learned from
    assert cache.get(entry, sandbox="bwrap", baseline=True) is None


def test_a_clean_verdict_is_a_baseline_fresh_and_cached_inside_the_sandbox() -> None:
    assert cache.usable_as_baseline(clean())
    entry = key_for("x", "bwrap")
    cache.put(entry, clean(), sandbox="bwrap")
    assert cache.get(entry, sandbox="bwrap", baseline=True) is not None


def test_a_cached_verdict_measured_without_the_sandbox_is_no_baseline() -> None:
    """Without the sandbox a candidate could have written HTAM_HOME, the cache included."""
    entry = key_for("x", "none")
    cache.put(entry, clean("none"), sandbox="none")
    hit = cache.get(entry, sandbox="none")
    assert hit is not None and not cache.usable_as_baseline(hit)
    assert cache.get(entry, sandbox="none", baseline=True) is None


def test_a_record_whose_verdict_names_another_sandbox_is_a_miss() -> None:
    entry = key_for("x", "bwrap")
    cache.put(entry, clean("none"), sandbox="bwrap")
    assert cache.get(entry, sandbox="bwrap") is None


def _writer(worker: int) -> None:  # a spawned process inherits the test's HTAM_HOME
    for index in range(40):
        cache.put(key_for(f"{worker}-{index}", "bwrap"), clean(), sandbox="bwrap")


def test_processes_writing_at_once_lose_no_record(home: Path) -> None:
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(n,)) for n in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
        assert process.exitcode == 0
    found = [
        cache.get(key_for(f"{n}-{i}", "bwrap"), sandbox="bwrap")
        for n in range(4)
        for i in range(40)
    ]
    lost = sum(verdict is None or not verdict.cached for verdict in found)
    assert not list((home / "eval-cache").glob("*corrupt*")), "a live cache was moved aside"
    assert lost == 0, f"{lost} of {len(found)} records lost"
