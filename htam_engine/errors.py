"""Errors every part of the engine may raise to the user (kept free of imports)."""


class UserError(Exception):
    """A problem the user can fix; the CLI prints it as one clear line (or one JSON
    document with `--json`, an error event with `--events`) and exits with code 2."""

    kind = "user_error"


class NoStartError(UserError):
    """A task with nothing to start from (a KernelBench problem without `ModelNew`) and no
    LLM to write the first implementation."""

    kind = "no_start"


class ReferenceFailed(UserError):
    """The task's reference itself fails (raises, returns something unusable): no
    candidate can be judged against it until it is fixed."""

    kind = "reference_error"


class TooLarge(UserError):
    """The problem needs more memory or disk than this machine gives an evaluation; the
    message names the estimate, the limit and a `--scale` that would fit."""

    kind = "too_large"
