"""The words every part of HTAM shares: step statuses, backends, devices, languages, tags.

Dependency-free, so the language server, the loop, the policy, the memory's validation
and the benchmarks all read the same table instead of keeping copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from typing import Literal, get_args

Backend = Literal["cuda", "cpu", "triton"]
Device = Literal["cuda", "cpu"]
Language = Literal["cuda", "cpp", "python"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEVICES: tuple[Device, ...] = get_args(Device)
LANGUAGES: tuple[Language, ...] = get_args(Language)

# The LLM providers a step can use ("auto": chosen from the environment, see llm.choice).
Provider = Literal["auto", "anthropic", "openai", "replay", "offline"]
PROVIDERS: tuple[Provider, ...] = get_args(Provider)

# A run's `stopped` when no strategy could be tried on its code (all excluded or none fits).
NOTHING_APPLIES = "no applicable strategy"

# How many steps one job of the server may take (its settings, htam.optimize, the editors).
MIN_STEPS = 1
MAX_STEPS = 100

# The states of a server job (`htam/jobState`); a job in a terminal one has ended.
JobState = Literal["queued", "running", "done", "failed", "cancelled", "refused"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
TERMINAL_JOB_STATES: tuple[JobState, ...] = ("done", "failed", "cancelled", "refused")

# The language of a kernel file by its suffix (lower case).
SUFFIX_LANGUAGES: dict[str, Language] = {
    ".cu": "cuda",
    ".cuh": "cuda",
    ".py": "python",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".cxx": "cpp",
    ".h": "cpp",
    ".hpp": "cpp",
}
# What the evaluator loads: a CUDA source ("cu") or a Python module ("py").
Kind = Literal["py", "cu"]


def kind_of(path: str | PurePath) -> Kind:
    """ "cu" for a CUDA source (.cu, .cuh), else "py"."""
    return "cu" if SUFFIX_LANGUAGES.get(PurePath(path).suffix) == "cuda" else "py"


class Status(StrEnum):
    """How one step ended, as the memory learns it."""

    IMPROVED = "improved"
    NOT_IMPROVED = "not_improved"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    NO_CODE = "no_code"
    CRASH = "crash"
    TIMEOUT = "timeout"
    NOT_CUSTOM_KERNEL = "not_custom_kernel"  # a library did the work without permission
    CHEATING = "cheating"  # deception: forged reports, oracles, tampering
    OOM = "oom"  # it compiled, then ran out of memory
    RUNTIME_ERROR = "runtime_error"  # it compiled, then raised
    CUDA_ERROR = "cuda_error"  # it compiled, then a CUDA call failed (a bad launch, access)

    @property
    def info(self) -> StatusInfo:
        return STATUS_TABLE[self]

    @property
    def correct(self) -> bool:
        return self in (Status.IMPROVED, Status.NOT_IMPROVED)


class ErrorKind(StrEnum):
    """Why an evaluation failed: every `EvalError.kind` the evaluator produces."""

    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    CRASH = "crash"
    OOM = "oom"
    CUDA_ERROR = "cuda_error"
    CHEATING = "cheating"
    NOT_CUSTOM_KERNEL = "not_custom_kernel"
    CANCELLED = "cancelled"
    NO_GPU = "no_gpu"
    REFERENCE_ERROR = "reference_error"  # the reference itself fails: no candidate's fault
    EVALUATOR_ERROR = "evaluator_error"  # the trusted judge failed: nobody's code was judged


# The verdicts that say nothing about a strategy (learning from them would only add noise)
UNRUNNABLE = frozenset(
    {ErrorKind.NO_GPU, ErrorKind.CANCELLED, ErrorKind.REFERENCE_ERROR, ErrorKind.EVALUATOR_ERROR}
)
# The status of a candidate that compiled but failed, by its error kind; any other kind
# (a failed check) is `Status.INCORRECT`.
FAILED_STATUS: dict[ErrorKind, Status] = {
    ErrorKind.CRASH: Status.CRASH,
    ErrorKind.TIMEOUT: Status.TIMEOUT,
    ErrorKind.CHEATING: Status.CHEATING,
    ErrorKind.NOT_CUSTOM_KERNEL: Status.NOT_CUSTOM_KERNEL,
    ErrorKind.OOM: Status.OOM,
    ErrorKind.RUNTIME_ERROR: Status.RUNTIME_ERROR,
    ErrorKind.CUDA_ERROR: Status.CUDA_ERROR,
}


@dataclass(frozen=True)
class StatusInfo:
    """penalty: the fixed reward of a failed step (None: the reward is the log speedup);
    relevance: how much a step that ended so says about what should follow (the policy's
    prefix weights); feedback: the tag the next state carries (seed triggers match it)."""

    penalty: float | None
    relevance: float
    feedback: str


# A wrong answer is worse than code that does not build, which is worse than no code at
# all (nothing was risked). A step that improved tells most about what should follow.
STATUS_TABLE: dict[str, StatusInfo] = {  # keyed by Status; a plain str finds it too
    Status.IMPROVED: StatusInfo(None, 1.0, "improved"),
    Status.NOT_IMPROVED: StatusInfo(None, 0.0, "slower"),
    Status.CHEATING: StatusInfo(-1.0, -0.5, "cheating"),
    Status.INCORRECT: StatusInfo(-1.0, -0.5, "incorrect"),
    Status.NOT_CUSTOM_KERNEL: StatusInfo(-0.75, -0.5, "not_custom_kernel"),
    Status.CRASH: StatusInfo(-1.0, -0.5, "crash"),
    # failures at run time weigh as a wrong answer does (what they counted as before)
    Status.OOM: StatusInfo(-1.0, -0.5, "oom"),
    Status.RUNTIME_ERROR: StatusInfo(-1.0, -0.5, "runtime_error"),
    Status.CUDA_ERROR: StatusInfo(-1.0, -0.5, "cuda_error"),
    Status.TIMEOUT: StatusInfo(-0.75, -0.5, "timeout"),
    Status.COMPILE_ERROR: StatusInfo(-0.5, -0.5, "compile_error"),
    Status.NO_CODE: StatusInfo(-0.25, -0.5, "no_code"),
}
# The groups `--allow-torch` (and `[policy] allow_torch` in htam.toml) accepts besides
# single aten op names: the library calls CUDA-Agent allows (cuBLAS GEMMs, cuDNN
# convolutions), by their names in torch's Python API and in aten, down to the backend
# kernels (an op run inside an allowed one is part of it, e.g. a transposed
# convolution's bias add).
TORCH_OP_GROUPS: dict[str, frozenset[str]] = {
    "gemm": frozenset(
        {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv"}
        | {"dot", "vdot", "tensordot", "_addmm_activation"}
    ),
    "conv": frozenset(
        {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "_convolution_mode"}
        | {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc"}
        | {"cudnn_convolution", "cudnn_convolution_transpose", "miopen_convolution"}
        | {"mkldnn_convolution", "thnn_conv2d", "_slow_conv2d_forward", "slow_conv3d"}
        | {"slow_conv3d_forward", "slow_conv_transpose2d", "slow_conv_transpose3d"}
        | {"slow_conv_dilated2d", "slow_conv_dilated3d", "_conv_depthwise2d"}
        | {"conv_depthwise3d", "_nnpack_spatial_convolution", "convolution_overrideable"}
    ),
}

FIRST_STEP = "first_step"  # the feedback tag of a run's first state
FEEDBACK_TAGS = frozenset({FIRST_STEP, *(info.feedback for info in STATUS_TABLE.values())})

FAMILIES = ("elementwise", "reduction", "matmul", "fused", "unknown")
# Every static feature tag `parsing.features` can produce, per backend.
FEATURE_TAGS: dict[Backend, frozenset[str]] = {
    "cuda": frozenset(
        {
            "shared_memory",
            "no_shared_memory",
            "vectorized_loads",
            "scalar_loads",
            "grid_stride",
            "no_grid_stride",
            "restrict_pointers",
            "no_restrict",
            "launch_bounds",
            "no_launch_bounds",
            "pragma_unroll",
            "fixed_trip_loop",
            "loops",
            "nested_loops",
            "atomics",
            "warp_shuffle",
            "syncthreads",
            "tensor_cores",
            "half_precision",
            "multiple_kernels",
            "small_block",
            "large_block",
            "fast_math",
            "no_fast_math",
            "warp_primitives",
            "blocked_loops",
        }
    ),  # fmt: skip
    "cpu": frozenset(
        {
            "openmp",
            "no_openmp",
            "simd_pragma",
            "no_simd",
            "opt_O3",
            "low_opt",
            "march_native",
            "restrict_pointers",
            "no_restrict",
            "loops",
            "nested_loops",
            "blocked_loops",
            "fixed_trip_loop",
            "intrinsics",
            "vector_types",
            "prefetch",
            "fast_math",
            "loop_division",
            "loop_branch",
            "loop_math",
            "hand_vectorized",
        }
    ),  # fmt: skip
    "triton": frozenset(
        {
            "masked",
            "unmasked",
            "tl_dot",
            "tf32_dot",
            "ieee_dot",
            "k_loop",
            "loops",
            "nested_loops",
            "autotune",
            "no_autotune",
            "num_warps_set",
            "default_warps",
            "num_stages_set",
            "default_stages",
            "block_ptr",
            "no_block_ptr",
            "grouped_ordering",
            "no_grouping",
            "eviction_hints",
            "atomics",
            "half_precision",
            "multiple_kernels",
            "persistent",
        }
    ),  # fmt: skip
}


# The timing's thread policy as a state tag (`State.tags`): a strategy that only pays
# with threads needs `multi_thread_timing`.
TIMING_TAGS = frozenset({"single_thread_timing", "multi_thread_timing"})
# Where the current code sits on the machine's roofline (`roofline.tags`).
ROOFLINE_TAGS = frozenset({"memory_bound", "compute_bound", "near_limit"})
# Nothing offered fits the current code any more (tried, failed, or set aside by the
# model): its own strategy is offered next (`Optimizer.plan`), instead of the run ending
# with steps left (a flat run ended so after 2 of 6 steps).
OFFERS_USED_UP = "offers_used_up"
# The code shown is confirmed slower than PyTorch on this machine (its interval wholly
# below 1): PyTorch's time proves it is not at its limit, so a chooser is not offered
# `stop` (a model stopped an L2 norm at 0.87x PyTorch, "already at its limit").
BEHIND_REFERENCE = "behind_reference"
# The outputs reach LARGE_OUTPUT_BYTES by the judge's sizing (no core's L2 is larger): a
# store-side strategy has something to stream (a hinge loss, whose output is one float,
# was offered streaming stores).
LARGE_OUTPUT = "large_output"
LARGE_OUTPUT_BYTES = 2 * 2**20


def state_tags(backend: Backend) -> frozenset[str]:
    """Every tag a state of `backend` can carry: what a seed trigger may name."""
    tags = FEATURE_TAGS[backend] | FEEDBACK_TAGS | set(FAMILIES) | TIMING_TAGS | ROOFLINE_TAGS
    return tags | {backend, OFFERS_USED_UP, BEHIND_REFERENCE, LARGE_OUTPUT}


# atol = rtol by output dtype, KernelBench's `get_tolerance_for_precision`
# (ScalingIntelligence/KernelBench, src/kernelbench/eval.py): fp32 1e-4, fp16 and bf16
# 1e-2 (from torchbench); fp64 1e-7 (torch.testing's float64 default). Other floats get
# fp32's; integers and booleans must match exactly. The judge and the prompts read this.
TOLERANCES = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}

# The precision check's bound, by output dtype: the relative L2 error against a float64
# reference that work in that dtype never needs (fp32 work is ~1e-7 off, half
# precision's ~3e-4; fp64 work is ~1e-15 off, fp32's ~1e-7), or PRECISION_FACTOR times
# the reference's own error in that dtype, whichever is more. Absent: no check
# (half-precision outputs, integers). The judge and the prompts read this.
PRECISION_FLOORS = {"float32": 1e-4, "float64": 1e-10}
PRECISION_FACTOR = 16.0
# Verification beyond the task's inputs (evaluate/wider.py), as the judge runs it and the
# prompts state it: floating inputs scaled to reach |x| = WIDE_MAGNITUDE, and one input
# set with each module-level size of at least MIN_SIZE made odd, near OTHER_SHARE of it.
WIDE_MAGNITUDE = 100.0
MIN_SIZE = 8
OTHER_SHARE = 0.75
