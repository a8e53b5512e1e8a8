"""Compile, verify and time candidates in isolated workers; see `runner` for the design."""

from htam_engine.evaluate.runner import evaluate
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Check, EvalError, Limits, Verdict

__all__ = ["Check", "EvalError", "Limits", "Verdict", "evaluate", "sandbox_mode"]
