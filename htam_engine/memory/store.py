"""The persistent HTG store: SQLite (WAL) for learned state plus an append-only journal.

Several processes (server, CLI, workers) share one store under `htam_engine.paths.home()`.
Every write is one `BEGIN IMMEDIATE` transaction; every value is JSON text, so a tampered
store can at worst fail validation, never execute code. Each write is also appended to
`memory-journal.jsonl` (under a file lock, fsynced) so that a corrupt database can be
rebuilt from the seed plus the journal.

The journal only ever holds committed writes: a write's journal record goes into the
database's outbox in the same transaction, and moves to the journal file only after
COMMIT. A kill before COMMIT leaves nothing anywhere; a kill after it leaves the record in
the outbox, flushed by the next process that opens the store; a kill between the
journal's fsync and the outbox's clearing leaves it in both, and a rebuild applies each
transaction (by its id) once. A committed `reset` empties the journal in the same flush.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from htam_engine import database, paths
from htam_engine.memory.model import (
    BACKENDS,
    EVIDENCE_BOUND,
    Edge,
    Evidence,
    Graph,
    MemoryDataError,
    Outcome,
    Stats,
    load_seed,
    revision_of,
    seed_version,
)

log = logging.getLogger("htam.memory")

DB_NAME = "memory.sqlite3"
JOURNAL_NAME = "memory-journal.jsonl"
LOCK_NAME = "memory.lock"
EXPORT_FORMAT = "htam-memory"
SCHEMA_VERSION = 3
BUSY_TIMEOUT_MS = 30_000


class MemoryStoreError(Exception):
    """A store problem the user can act on (bad import file, store from a newer HTAM)."""


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE learned (backend TEXT, kind TEXT, id TEXT, value TEXT NOT NULL,"
        " PRIMARY KEY (backend, kind, id))"
    )
    db.execute(
        "CREATE TABLE kv (namespace TEXT, key TEXT, value TEXT NOT NULL,"
        " PRIMARY KEY (namespace, key))"
    )


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """v2 records when each key/value was written so `items` can list newest first."""
    db.execute("ALTER TABLE kv ADD COLUMN updated REAL NOT NULL DEFAULT 0")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """v3 holds each write's journal record in the write's own transaction (the outbox)
    until it is in the journal file, so the journal never holds an uncommitted write."""
    db.execute(
        "CREATE TABLE journal_outbox (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " op TEXT NOT NULL, record TEXT NOT NULL)"
    )


# MIGRATIONS[v] upgrades a database at schema version v to v + 1.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _migrate_0_to_1,
    _migrate_1_to_2,
    _migrate_2_to_3,
)


class MemoryStore:
    """The learned HTG memory of every backend, shared safely between processes."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = Path(home) if home is not None else paths.home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.db_path = self.home / DB_NAME
        self.journal_path = self.home / JOURNAL_NAME
        self._lock_path = self.home / LOCK_NAME
        self._guard = threading.RLock()  # one connection, shared by the loop's and server's threads
        self._db = self._open_checked()
        self._flush_outbox()  # what a killed writer committed but did not journal

    # --- opening, migration, recovery ------------------------------------------------

    def _connect(self, path: Path) -> sqlite3.Connection:
        db = database.open_wal(
            path, BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        db.execute("PRAGMA synchronous = NORMAL")
        return db

    def _open_checked(self) -> sqlite3.Connection:
        try:
            return self._try_open()
        except sqlite3.DatabaseError as error:
            if not database.damaged(error):
                raise  # busy past the timeout, a full disk: not the file's fault
            return self._rebuild(str(error))

    def _try_open(self) -> sqlite3.Connection:
        """Open, verify and migrate the database; sqlite3.DatabaseError if it is damaged."""
        db = self._connect(self.db_path)
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("integrity check failed")
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise MemoryStoreError(
                f"{self.db_path} has schema version {version}, newer than this HTAM "
                f"({SCHEMA_VERSION}); upgrade HTAM or use another HTAM_HOME"
            )
        if version == SCHEMA_VERSION:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            for step in MIGRATIONS[version:]:
                step(db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _rebuild(self, reason: str) -> sqlite3.Connection:
        """Move the corrupt database aside and replay the journal into a fresh one.

        Under the journal lock, so that of several processes finding the same damage only
        the first rebuilds and the others open its result.
        """
        with self._journal_lock():
            try:
                return self._try_open()  # another process rebuilt it while we waited
            except sqlite3.DatabaseError as error:
                if not database.damaged(error):
                    raise
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for suffix in ("", "-wal", "-shm"):
                old = Path(f"{self.db_path}{suffix}")
                if old.exists():
                    old.replace(f"{self.db_path}.corrupt-{stamp}{suffix}")
            db = self._connect(self.db_path)
            self._migrate(db)
            records = list(self._read_journal())
            self._db = db
            with self._transaction() as tx:
                for record in _once_per_transaction(records):
                    self._replay(tx, record)
        log.warning(
            "HTAM memory store %s was unreadable (%s); rebuilt from the seed and %d journal "
            "records (the damaged file was kept as %s.corrupt-%s)",
            self.db_path,
            reason,
            len(records),
            DB_NAME,
            stamp,
        )
        return db

    def _read_journal(self) -> Iterator[dict[str, Any]]:
        if not self.journal_path.exists():
            return
        with self.journal_path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("journal line %d is damaged and was skipped", number)
                    continue
                if isinstance(record, dict):
                    yield record

    def _replay(self, tx: sqlite3.Connection, record: dict[str, Any]) -> None:
        op = record.get("op")
        try:
            if op == "outcome":
                self._apply(tx, Outcome.from_json(record.get("outcome")))
            elif op == "put":
                self._put(tx, str(record["namespace"]), str(record["key"]), record["value"])
            elif op == "import":
                self._load_snapshot(tx, _validate_snapshot(record.get("data")))
            elif op == "reset":
                self._clear(tx)
        except (MemoryDataError, MemoryStoreError, KeyError) as error:
            log.warning("journal record skipped during rebuild: %s", error)

    # --- plumbing ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _journal_lock(self) -> Iterator[None]:
        with self._lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._guard:
            return self._db.execute(sql, params).fetchall()

    def _write(self, record: dict[str, Any], change: Callable[[sqlite3.Connection], None]) -> None:
        """One transaction applies `change` and queues `record` for the journal; the
        journal gets it only once the transaction has committed."""
        line = json.dumps({**record, "txn": uuid.uuid4().hex}, separators=(",", ":"))
        with self._transaction() as tx:
            change(tx)
            tx.execute(
                "INSERT INTO journal_outbox (op, record) VALUES (?, ?)", (record["op"], line)
            )
        self._flush_outbox()

    def _flush_outbox(self) -> None:
        """Move committed journal records from the outbox to the journal file, then drop
        them from the outbox (a kill in between journals them twice; a rebuild applies
        each transaction once)."""
        with self._guard, self._journal_lock():
            rows = self._query("SELECT id, op, record FROM journal_outbox ORDER BY id")
            if not rows:
                return
            resets = [index for index, (_, op, _) in enumerate(rows) if op == "reset"]
            lines = [f"{record}\n" for _, _, record in rows]
            if resets:  # a committed reset: nothing before it matters any more
                self._replace_journal(lines[resets[-1] + 1 :])
            else:
                self._append_journal(lines)
            with self._transaction() as tx:
                tx.execute("DELETE FROM journal_outbox WHERE id <= ?", (rows[-1][0],))

    def _append_journal(self, lines: list[str]) -> None:
        with self.journal_path.open("a", encoding="utf-8") as journal:
            journal.write("".join(lines))
            journal.flush()
            os.fsync(journal.fileno())

    def _replace_journal(self, lines: list[str]) -> None:
        """Atomically make `lines` the whole journal (written and fsynced aside first)."""
        partial = self.journal_path.with_name(f"{JOURNAL_NAME}.partial")
        with partial.open("w", encoding="utf-8") as journal:
            journal.write("".join(lines))
            journal.flush()
            os.fsync(journal.fileno())
        partial.replace(self.journal_path)
        folder = os.open(self.home, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the HTG -------------------------------------------------------------------------

    def graph(self, backend: str) -> Graph:
        """The seed of `backend` with every learned statistic and evidence overlaid."""
        graph = load_seed(backend)
        rows = self._query("SELECT kind, id, value FROM learned WHERE backend = ?", (backend,))
        for kind, key, value in rows:
            _overlay(graph, kind, key, _decode(value, f"{backend} {kind} {key}"))
        graph.revision = revision_of(graph.seed_version, *sorted(map(repr, rows)))
        return graph

    def apply_outcome(self, outcome: Outcome) -> None:
        """Update node stats, bounded evidence and every prefix edge in one transaction."""
        load_seed(outcome.backend).check_outcome(outcome)
        self._write(
            {"op": "outcome", "outcome": outcome.to_json()}, lambda tx: self._apply(tx, outcome)
        )

    def _apply(self, tx: sqlite3.Connection, outcome: Outcome) -> None:
        """Load only the rows the outcome touches, run the model's update rule, write them back."""
        graph = load_seed(outcome.backend)
        keys = [("global", outcome.global_id), ("local", outcome.local_id)]
        keys += [("edge", f"{src}->{outcome.global_id}") for src in outcome.prefix]
        for kind, key in keys:
            row = tx.execute(
                "SELECT value FROM learned WHERE backend = ? AND kind = ? AND id = ?",
                (outcome.backend, kind, key),
            ).fetchone()
            if row is not None:
                _overlay(graph, kind, key, _decode(row[0], f"{kind} {key}"))
        graph.apply_outcome(outcome)
        for kind, key in keys:
            tx.execute(
                "INSERT OR REPLACE INTO learned VALUES (?, ?, ?, ?)",
                (outcome.backend, kind, key, json.dumps(_learned_value(graph, kind, key))),
            )

    # --- key/value -----------------------------------------------------------------------

    def put(self, namespace: str, key: str, value: Any) -> None:
        """Store a JSON-serializable value (trajectories, suggestions)."""
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise MemoryStoreError(f"value for {namespace}/{key} is not JSON: {error}") from error
        record = {"op": "put", "namespace": namespace, "key": key, "value": value}
        self._write(record, lambda tx: self._put(tx, namespace, key, value))

    @staticmethod
    def _put(tx: sqlite3.Connection, namespace: str, key: str, value: Any) -> None:
        tx.execute(
            "INSERT OR REPLACE INTO kv (namespace, key, value, updated) VALUES (?, ?, ?, ?)",
            (namespace, key, json.dumps(value), time.time()),
        )

    def get(self, namespace: str, key: str) -> Any:
        """The value stored under namespace/key, or None."""
        rows = self._query("SELECT value FROM kv WHERE namespace = ? AND key = ?", (namespace, key))
        return _decode(rows[0][0], f"{namespace}/{key}") if rows else None

    def items(self, namespace: str) -> list[tuple[str, Any]]:
        """Every (key, value) of a namespace, newest first."""
        rows = self._query(
            "SELECT key, value FROM kv WHERE namespace = ? ORDER BY updated DESC, key", (namespace,)
        )
        return [(key, _decode(value, f"{namespace}/{key}")) for key, value in rows]

    # --- export / import / reset -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything learned, as one JSON document (the export format)."""
        learned = self._query("SELECT backend, kind, id, value FROM learned ORDER BY 1, 2, 3")
        kv = self._query("SELECT namespace, key, value FROM kv ORDER BY 1, 2")
        return {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "seed_versions": {backend: seed_version(backend) for backend in BACKENDS},
            "learned": [
                {"backend": b, "kind": k, "id": i, "value": json.loads(v)} for b, k, i, v in learned
            ],
            "kv": [{"namespace": n, "key": k, "value": json.loads(v)} for n, k, v in kv],
        }

    def export_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.snapshot(), indent=1), encoding="utf-8")

    def import_json(self, path: Path) -> None:
        """Replace the learned memory with a validated export; a bad file changes nothing."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise MemoryStoreError(f"cannot read {path}: {error.strerror}") from error
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise MemoryStoreError(f"{path} is not JSON: {error}") from error
        try:
            snapshot = _validate_snapshot(data)
        except MemoryDataError as error:
            raise MemoryStoreError(f"{path} is not a valid HTAM memory export: {error}") from error
        self._write(
            {"op": "import", "data": snapshot}, lambda tx: self._load_snapshot(tx, snapshot)
        )

    @staticmethod
    def _load_snapshot(tx: sqlite3.Connection, snapshot: dict[str, Any]) -> None:
        tx.execute("DELETE FROM learned")
        tx.execute("DELETE FROM kv")
        for row in snapshot["learned"]:
            values = (row["backend"], row["kind"], row["id"], json.dumps(row["value"]))
            tx.execute("INSERT INTO learned VALUES (?, ?, ?, ?)", values)
        for row in snapshot["kv"]:
            MemoryStore._put(tx, row["namespace"], row["key"], row["value"])

    def reset(self) -> None:
        """Forget everything learned (statistics, evidence, stored values) and the journal."""
        self._write({"op": "reset"}, self._clear)

    @staticmethod
    def _clear(tx: sqlite3.Connection) -> None:
        tx.execute("DELETE FROM learned")
        tx.execute("DELETE FROM kv")


def _once_per_transaction(records: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The journal's records, each transaction once (a killed flush may have written one
    twice); records from before transaction ids always count."""
    seen: set[str] = set()
    for record in records:
        txn = record.get("txn")
        if isinstance(txn, str):
            if txn in seen:
                continue
            seen.add(txn)
        yield record


# --- learned rows <-> graph --------------------------------------------------------------


def _decode(text: Any, where: str) -> Any:
    """A stored value: JSON text only; anything else is reported, never interpreted."""
    if not isinstance(text, str):
        raise MemoryDataError(f"store row {where} is not JSON text")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise MemoryDataError(f"store row {where} is not valid JSON: {error}") from error


def learned_rows(graph: Graph) -> list[dict[str, Any]]:
    """The export rows of everything `graph` has learned (nodes and edges with attempts)."""
    keys = [("global", gid) for gid, g in graph.globals.items() if g.stats.attempts]
    keys += [("local", lid) for lid, lo in graph.locals.items() if lo.stats.attempts]
    keys += [("edge", f"{s}->{d}") for (s, d), e in graph.edges.items() if e.stats.attempts]
    return [
        {
            "backend": graph.backend,
            "kind": kind,
            "id": key,
            "value": _learned_value(graph, kind, key),
        }
        for kind, key in keys
    ]


def _learned_value(graph: Graph, kind: str, key: str) -> dict[str, Any]:
    if kind == "global":
        return {"stats": graph.globals[key].stats.to_json()}
    if kind == "local":
        node = graph.locals[key]
        return {
            "stats": node.stats.to_json(),
            "evidence_positive": [e.to_json() for e in node.evidence_positive],
            "evidence_negative": [e.to_json() for e in node.evidence_negative],
        }
    src, dst = key.split("->", 1)
    return {"stats": graph.edge(src, dst).stats.to_json()}


def _overlay(graph: Graph, kind: str, key: str, value: Any) -> None:
    """Put one learned row onto the seed graph (validating it)."""
    where = f"{graph.backend} {kind} {key}"
    if not isinstance(value, dict):
        raise MemoryDataError(f"{where}: value must be an object")
    stats = Stats.from_json(value.get("stats"), where)
    if kind == "global" and key in graph.globals:
        graph.globals[key].stats = stats
    elif kind == "local" and key in graph.locals:
        node = graph.locals[key]
        node.stats = stats
        node.evidence_positive = _evidence_list(value, "evidence_positive", where)
        node.evidence_negative = _evidence_list(value, "evidence_negative", where)
    elif kind == "edge" and "->" in key:
        src, dst = key.split("->", 1)
        if dst not in graph.globals or (src not in graph.globals and src != "START"):
            raise MemoryDataError(f"{where}: edge between unknown directions")
        edge = graph.edges.setdefault((src, dst), Edge(src, dst, why="learned from trajectories"))
        edge.stats = stats
    else:
        raise MemoryDataError(f"{where}: unknown {kind} (not in seed {graph.seed_version})")


def _evidence_list(value: dict[str, Any], key: str, where: str) -> list[Evidence]:
    items = value.get(key, [])
    if not isinstance(items, list):
        raise MemoryDataError(f"{where}: {key} must be a list")
    return [Evidence.from_json(item, where) for item in items[:EVIDENCE_BOUND]]


def _validate_snapshot(data: Any) -> dict[str, Any]:
    """Check an export document completely (every row overlays onto its seed)."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise MemoryDataError(f"'format' must be {EXPORT_FORMAT!r}")
    version = data.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise MemoryDataError(f"unsupported schema_version {version!r}")
    learned, kv = data.get("learned", []), data.get("kv", [])
    if not isinstance(learned, list) or not isinstance(kv, list):
        raise MemoryDataError("'learned' and 'kv' must be lists")
    graphs = {backend: load_seed(backend) for backend in BACKENDS}
    for row in learned:
        if not isinstance(row, dict) or row.get("backend") not in graphs:
            raise MemoryDataError(f"learned row with unknown backend: {str(row)[:80]}")
        if not isinstance(row.get("kind"), str) or not isinstance(row.get("id"), str):
            raise MemoryDataError(f"learned row needs string 'kind' and 'id': {str(row)[:80]}")
        _overlay(graphs[row["backend"]], row["kind"], row["id"], row.get("value"))
    for row in kv:
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) for k in ("namespace", "key")
        ):
            raise MemoryDataError(f"kv row needs string 'namespace' and 'key': {str(row)[:80]}")
    return {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "learned": learned, "kv": kv}
