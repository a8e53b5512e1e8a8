"""The Hierarchical Transition Graph (HTG) memory: model, seed data and the shared store."""

from htam_engine.memory.model import (
    EVIDENCE_BOUND,
    START,
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
    "EVIDENCE_BOUND",
    "SCHEMA_VERSION",
    "START",
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
