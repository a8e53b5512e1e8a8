"""Server settings: `initializationOptions` first, then `workspace/configuration` ("htam").

`allowExecution` can only be *granted* by initialization options, which the client
derives from a decision of the user (VS Code: Workspace Trust; Neovim: `init_options`).
A workspace's own settings file could come from an untrusted repository, so
`workspace/configuration` may switch execution off but never on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from htam_engine.machine import DEVICE_CHOICES
from htam_engine.vocabulary import MAX_STEPS, MIN_STEPS, PROVIDERS

CLIENT_KEYS = ("interpreter", "progress")  # settings of the editor extensions themselves
MIN_SPEEDUP = 1.10  # an apply action only for a candidate at least this much faster


@dataclass(frozen=True)
class Settings:
    provider: str = "auto"
    model: str | None = None
    base_url: str | None = None
    steps: int = 6
    device: str = "auto"
    allow_execution: bool = False
    cassette: str | None = None
    min_speedup: float = MIN_SPEEDUP
    # start the next step's process (the engine, a judge and two workers) while a bound
    # kernel is open: the first step starts sooner, and idle it holds about 1.2 GB
    start_ahead: bool = True

    def to_json(self) -> dict[str, Any]:
        """The settings in effect, with the clients' key names (for `htam.status`)."""
        return {
            "provider": self.provider,
            "model": self.model,
            "baseUrl": self.base_url,
            "steps": self.steps,
            "device": self.device,
            "allowExecution": self.allow_execution,
            "cassette": self.cassette,
            "minSpeedup": self.min_speedup,
            "startAhead": self.start_ahead,
        }

    def merged(self, raw: Any, *, may_allow: bool) -> tuple[Settings, list[str]]:
        """These settings updated from a client dict; problems name each ignored value."""
        if raw is None:
            return self, []
        if not isinstance(raw, dict):
            return self, [f"settings must be an object, got {type(raw).__name__}"]
        raw = raw.get("htam", raw) if isinstance(raw.get("htam"), dict) else raw
        problems: list[str] = []
        changes: dict[str, Any] = {}
        for key, value in raw.items():
            problem = _apply(key, value, changes, may_allow)
            if problem:
                problems.append(problem)
        return replace(self, **changes), problems


def _apply(key: str, value: Any, changes: dict[str, Any], may_allow: bool) -> str | None:
    if value is None or key in CLIENT_KEYS:
        return None
    if key in ("provider", "device"):
        allowed = PROVIDERS if key == "provider" else DEVICE_CHOICES
        if value not in allowed:
            return f"htam.{key}: {value!r} is not one of {', '.join(allowed)}"
        changes[key] = value
    elif key in ("model", "baseUrl", "cassette"):
        if not isinstance(value, str):
            return f"htam.{key}: expected a string"
        changes["base_url" if key == "baseUrl" else key] = value or None
    elif key == "steps":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not MIN_STEPS <= value <= MAX_STEPS
        ):
            return f"htam.steps: expected an integer from {MIN_STEPS} to {MAX_STEPS}"
        changes["steps"] = value
    elif key == "minSpeedup":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 100:
            return "htam.minSpeedup: expected a number from 1 to 100 (e.g. 1.1 for 10% faster)"
        changes["min_speedup"] = float(value)
    elif key == "startAhead":
        if not isinstance(value, bool):
            return "htam.startAhead: expected true or false"
        changes["start_ahead"] = value
    elif key == "allowExecution":
        if not isinstance(value, bool):
            return "htam.allowExecution: expected true or false"
        if value and not may_allow:
            return None  # only the client's initialization options can grant execution
        changes["allow_execution"] = value
    else:
        return f"htam.{key}: not a setting of htam-lsp"
    return None
