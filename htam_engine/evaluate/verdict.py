"""What one evaluation says: the `Verdict`, its checks and its error."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# every `EvalError.kind` the evaluator produces
ERROR_KINDS = (
    "compile_error",
    "runtime_error",
    "incorrect",
    "timeout",
    "crash",
    "oom",
    "cuda_error",
    "cheating",
    "not_custom_kernel",
    "cancelled",
    "no_gpu",
    "reference_error",  # the reference itself fails: no candidate's fault, nothing learned
)
SUSPECT_SPEEDUP = 10.0


@dataclass(frozen=True)
class Limits:
    """Wall-clock limits in seconds per phase, and the address-space cap of a CPU worker."""

    compile_s: float = 120.0
    verify_s: float = 60.0
    time_s: float = 120.0
    memory_mb: int = 16384
    input_sets: int = 3


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class EvalError:
    kind: str
    message: str
    excerpt: str = ""
    line: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {self.kind!r}")


@dataclass
class Verdict:
    """The outcome of evaluating one candidate; `to_json()` is the CLI's `--json` document."""

    compiled: bool = False
    correct: bool = False
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    device: str = "cpu"
    samples: dict[str, list[float]] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    error: EvalError | None = None
    cached: bool = False
    suspect: bool = False
    inputs_checked: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    sandbox: str = "none"  # "bwrap" or "none": how the candidate was isolated
    threads: int = 0  # the CPU thread count both reference and candidate were timed with
    note: str = ""  # why a correct verdict has no timing (Triton under its interpreter)
    # The paired speedup's 95 % interval (estimate, low, high, pairs, half_width), whether
    # it narrowed to the device's target, the load average around the timing, and whether
    # those conditions make the number noisy.
    interval: dict[str, float] = field(default_factory=dict)
    converged: bool = False
    load: dict[str, float] = field(default_factory=dict)
    noisy: bool = False
    # The library policy it was judged under (aten op names the candidate may leave to
    # torch, `--allow-torch`) and those of them its calls actually ran.
    allow_torch: list[str] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)
    # When the problem was shrunk to fit (`--scale`): the factor and each size changed,
    # {"factor": 0.1, "sizes": {"batch_size": [4096, 409]}}; empty when run as written.
    scaled: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        fields = dict(data)
        fields["checks"] = [Check(**check) for check in data.get("checks", [])]
        fields["error"] = EvalError(**data["error"]) if data.get("error") else None
        return cls(**fields)
