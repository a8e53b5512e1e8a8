"""The Hierarchical Transition Graph (HTG) memory: model, seed data and the shared store."""

from htam_engine.memory.model import (
    BACKENDS,
    EVIDENCE_BOUND,
    MECHANICAL_IDS,
    START,
    STATUSES,
    Edge,
    Evidence,
    GlobalNode,
    Graph,
    LocalNode,
    MemoryDataError,
    Outcome,
    Stats,
    load_seed,
)
from htam_engine.memory.store import SCHEMA_VERSION, MemoryStore, MemoryStoreError

__all__ = [
    "BACKENDS",
    "EVIDENCE_BOUND",
    "MECHANICAL_IDS",
    "SCHEMA_VERSION",
    "START",
    "STATUSES",
    "Edge",
    "Evidence",
    "GlobalNode",
    "Graph",
    "LocalNode",
    "MemoryDataError",
    "MemoryStore",
    "MemoryStoreError",
    "Outcome",
    "Stats",
    "load_seed",
]
