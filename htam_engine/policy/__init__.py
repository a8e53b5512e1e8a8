"""The selection policy: transition-aware global selection, local selection, reward."""

from htam_engine.policy.global_select import (
    MODES,
    Candidate,
    EdgeTerm,
    GlobalDecision,
    PolicyConfig,
    PrefixWeight,
    make_prefix,
    prefix_weights,
    select_global,
    softmax,
)
from htam_engine.policy.local_select import (
    EvidenceLocalSelector,
    LocalDecision,
    LocalSelector,
    NoApplicableStrategy,
)
from htam_engine.policy.reward import reward

__all__ = [
    "MODES",
    "NoApplicableStrategy",
    "Candidate",
    "EdgeTerm",
    "EvidenceLocalSelector",
    "GlobalDecision",
    "LocalDecision",
    "LocalSelector",
    "PolicyConfig",
    "PrefixWeight",
    "make_prefix",
    "prefix_weights",
    "reward",
    "select_global",
    "softmax",
]
