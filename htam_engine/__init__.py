"""HTAM engine: memory, policy, evaluation, strategies, LLM providers and the loop."""

__version__ = "0.1.0"
