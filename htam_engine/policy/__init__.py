"""The selection policy: transition-aware global selection, local selection, reward."""

from htam_engine.decisions import Candidate, EdgeTerm, GlobalDecision, LocalDecision, PrefixWeight
from htam_engine.policy.global_select import (
    CONVERGED_AFTER,
    MODES,
    PolicyConfig,
    make_prefix,
    predicts_no_gain,
    prefix_weights,
    select_global,
    softmax,
)
from htam_engine.policy.local_select import (
    OTHER,
    STOP,
    EvidenceLocalSelector,
    LocalSelector,
    NoApplicableStrategy,
    unfit,
)
from htam_engine.policy.reward import reward

__all__ = [
    "MODES",
    "OTHER",
    "STOP",
    "CONVERGED_AFTER",
    "predicts_no_gain",
    "unfit",
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
