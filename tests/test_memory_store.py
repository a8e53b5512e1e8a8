"""The persistent store: atomic concurrent updates, JSON only, recovery, import, migration."""

from __future__ import annotations

import json
import logging
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from htam_engine.memory import (
    START,
    MemoryDataError,
    MemoryStore,
    MemoryStoreError,
    Outcome,
    load_seed,
)
from htam_engine.memory.store import (
    DB_NAME,
    EXPORT_FORMAT,
    MIGRATIONS,
    SCHEMA_VERSION,
    learned_rows,
)

PROCESSES = 8
UPDATES = 200


def outcome(status: str = "improved", speedup: float | None = 1.5, **changes: object) -> Outcome:
    fields: dict[str, object] = {
        "backend": "cpu",
        "task_signature": "cpu:softmax:f32[64x64]",
        "prefix": [START, "compiler_flags"],
        "alphas": [0.4, 0.6],
        "global_id": "thread_parallelism",
        "local_id": "omp_parallel_for",
        "status": status,
        "compiled": status not in ("compile_error", "no_code"),
        "correct": status in ("improved", "not_improved"),
        "speedup": speedup,
        "runtime_ms": 1.0,
        "reward": 0.4 if status == "improved" else -0.5,
        "code_excerpt": "#pragma omp parallel for",
    }
    fields.update(changes)
    return Outcome(**fields)  # type: ignore[arg-type]


def _worker(home: str) -> None:
    with MemoryStore(Path(home)) as store:
        for i in range(UPDATES):
            store.apply_outcome(outcome(task_signature=f"cpu:t{i % 7}:f32", speedup=1.0 + i % 5))


def test_concurrent_processes_lose_no_update(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(str(tmp_path),)) for _ in range(PROCESSES)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=300)
        assert process.exitcode == 0
    graph = MemoryStore(tmp_path).graph("cpu")
    total = PROCESSES * UPDATES
    assert graph.globals["thread_parallelism"].stats.attempts == total
    assert graph.locals["omp_parallel_for"].stats.attempts == total
    assert graph.edges[("compiler_flags", "thread_parallelism")].stats.attempts == total
    assert len(graph.locals["omp_parallel_for"].evidence_positive) <= 5
    journal = (tmp_path / "memory-journal.jsonl").read_text().splitlines()
    assert len(journal) == total


def test_edges_get_credit_by_alpha_and_values_are_json_text(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.apply_outcome(outcome())
    graph = store.graph("cpu")
    assert graph.edges[(START, "thread_parallelism")].stats.weight == pytest.approx(0.4)
    assert graph.edges[("compiler_flags", "thread_parallelism")].stats.weight == pytest.approx(0.6)
    rows = sqlite3.connect(tmp_path / DB_NAME).execute(
        "SELECT typeof(value), value FROM learned UNION ALL SELECT typeof(value), value FROM kv"
    )
    for kind, value in rows:
        assert kind == "text"
        json.loads(value)


def test_a_tampered_row_is_reported_never_executed(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.apply_outcome(outcome())
    marker = tmp_path / "pwned"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        db.execute("UPDATE learned SET value = ? WHERE kind = 'local'", (payload,))
    with pytest.raises(MemoryDataError, match="not JSON text"):
        MemoryStore(tmp_path).graph("cpu")
    assert not marker.exists()


def test_put_get_items_round_trip_json_and_reject_other_values(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.put("trajectories", "run-1", {"steps": [1, 2], "best": 1.5})
    store.put("trajectories", "run-2", ["a"])
    assert store.get("trajectories", "run-1") == {"steps": [1, 2], "best": 1.5}
    assert store.get("trajectories", "missing") is None
    assert [key for key, _ in store.items("trajectories")] == ["run-2", "run-1"]
    with pytest.raises(MemoryStoreError, match="not JSON"):
        store.put("trajectories", "bad", object())


def test_corrupt_store_is_rebuilt_from_journal_with_one_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(tmp_path)
    for _ in range(3):
        store.apply_outcome(outcome())
    store.put("suggestions", "k", {"x": 1})
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / DB_NAME}{suffix}").unlink(missing_ok=True)
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="htam.memory"):
        rebuilt = MemoryStore(tmp_path)
    assert [r for r in caplog.records if "rebuilt" in r.getMessage()]
    assert rebuilt.graph("cpu").locals["omp_parallel_for"].stats.attempts == 3
    assert rebuilt.get("suggestions", "k") == {"x": 1}
    assert list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))


def test_a_busy_store_is_an_error_and_never_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held past the timeout is not damage: nothing is moved aside or replayed."""
    store = MemoryStore(tmp_path)
    store.apply_outcome(outcome())
    store.close()
    monkeypatch.setattr("htam_engine.memory.store.BUSY_TIMEOUT_MS", 300)
    holder = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        MemoryStore(tmp_path)
    holder.close()
    assert not list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
    assert MemoryStore(tmp_path).graph("cpu").locals["omp_parallel_for"].stats.attempts == 1


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"format": "something-else"}),
        json.dumps({"format": "htam-memory", "schema_version": 99, "learned": [], "kv": []}),
        json.dumps(
            {
                "format": "htam-memory",
                "schema_version": SCHEMA_VERSION,
                "learned": [{"backend": "cpu", "kind": "local", "id": "no_such", "value": {}}],
                "kv": [],
            }
        ),
    ],
)
def test_import_of_a_bad_file_fails_clearly_and_changes_nothing(
    tmp_path: Path, content: str
) -> None:
    store = MemoryStore(tmp_path / "home")
    store.apply_outcome(outcome())
    before = store.snapshot()
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(MemoryStoreError):
        store.import_json(bad)
    assert store.snapshot() == before


def test_export_import_round_trip_into_another_home(tmp_path: Path) -> None:
    source = MemoryStore(tmp_path / "a")
    source.apply_outcome(outcome())
    source.put("trajectories", "r", {"n": 1})
    source.export_json(tmp_path / "memory.json")
    target = MemoryStore(tmp_path / "b")
    target.import_json(tmp_path / "memory.json")
    assert target.snapshot()["learned"] == source.snapshot()["learned"]
    assert target.get("trajectories", "r") == {"n": 1}
    target.reset()
    assert target.graph("cpu").locals["omp_parallel_for"].stats.attempts == 0
    assert target.items("trajectories") == []


def test_a_version_1_store_is_migrated_and_keeps_its_data(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        MIGRATIONS[0](db)
        db.execute("INSERT INTO kv VALUES ('ns', 'k', '{\"old\": true}')")
        db.execute("PRAGMA user_version = 1")
    store = MemoryStore(tmp_path)
    assert store.get("ns", "k") == {"old": True}
    version = sqlite3.connect(tmp_path / DB_NAME).execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION


def test_a_store_from_a_newer_htam_is_refused_clearly(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(MemoryStoreError, match="newer than this HTAM"):
        MemoryStore(tmp_path)


def test_outcomes_naming_unknown_nodes_are_rejected(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    bad = [
        outcome(local_id="smem_tiling"),
        outcome(status="great"),
        outcome(alphas=[1.0]),
        outcome(reward=float("nan")),
        outcome(prefix=[START, "nowhere"]),
    ]
    for each in bad:
        with pytest.raises(MemoryDataError):
            store.apply_outcome(each)
    assert not (tmp_path / "memory-journal.jsonl").exists()


def test_learned_rows_of_an_in_memory_graph_import_into_the_store(tmp_path: Path) -> None:
    graph = load_seed("cpu")
    for _ in range(4):
        graph.apply_outcome(outcome())
    document = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "learned": learned_rows(graph),
        "kv": [],
    }
    (tmp_path / "learned.json").write_text(json.dumps(document))
    store = MemoryStore(tmp_path / "home")
    store.import_json(tmp_path / "learned.json")
    stored = store.graph("cpu")
    assert stored.locals["omp_parallel_for"] == graph.locals["omp_parallel_for"]
    assert stored.edges[(START, "thread_parallelism")].stats.weight == pytest.approx(1.6)
