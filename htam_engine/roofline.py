"""Speed of light: how far a timed kernel is from what this machine can do.

Two facts meet here. The machine's limits (`MachineLimits`), measured once per machine
and kept under the HTAM home by a fingerprint of it: STREAM-like memory bandwidth (the
best of copy, triad and memcpy) over working sets from cache-sized to far past the last
level cache, and the peak FP32 FLOP/s: the higher of torch's GEMM and a loop of
independent FMA chains at the ISA's width (`FMA_SOURCE`; torch's GEMM can run far below
the core's FMA peak: 81 of 240 GFLOP/s on an AVX-512 EPYC, where a register-tiled kernel
reached 205), and the exps a second of a vectorized polynomial exp at the same width
(`EXP_SOURCE`), each with one thread and with all cores; on a GPU the device's copy
bandwidth and GEMM peaks, and its special function units' rate from its specifications
(`sfu_gops`). And the task's minimal work (`Work`): the bytes that must move once (inputs,
outputs, parameters), the FLOPs `torch.utils.flop_counter.FlopCounterMode` counts on the
reference (matmul-class ops only: elementwise arithmetic counts none), and its special
functions (`special_ops`: one per output element of an exp, log, erf, tanh, sigmoid,
sin...; softmax counts its exps), so the time derived is a lower bound. The judge
counts the work on the forward it runs anyway; the limits (and a work the judge could
not count) come from a trusted child (`python -m htam_engine.roofline measure|work`):
the caller imports no torch.

`place` puts a timed verdict on the roofline under the timing policy (one thread): the
bandwidth the bound uses is the one measured at the task's footprint (a problem that
fits in cache is held to the cache's speed, not DRAM's), the roofline time is
max(bytes / bandwidth, flops / peak, special ops / exp rate), and the fraction is roofline
time / measured time. On an AVX-512 EPYC core one exp (4 G/s) takes as long as streaming
6 bytes from DRAM or 25 from L2, against the 8 a softmax moves an element: a softmax in
cache is bound by its exps, not "memory-bound with 0 FLOPs".
A candidate whose slowest plausible time (the slow end of its interval) still beats the
roofline time by `FASTER_THAN_LIGHT` is `suspect`: re-verified, never a baseline.

The fingerprint's CPU model and ISA come from `machine.cpu_facts`, as the prompt's do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from htam_engine import machine
from htam_engine.errors import UserError
from htam_engine.paths import subdir, write_whole
from htam_engine.placement import Limiting, Placement, Unplaced, Where

if TYPE_CHECKING:
    from htam_engine.evaluate.verdict import Verdict

SCHEMA = 6  # bump when what is measured changes: older caches are measured again
LIMITS_ENV = "HTAM_MACHINE_LIMITS"  # one file for the limits (a test session's)
MACHINE_DIR_ENV = "HTAM_MACHINE_DIR"  # the folder every HTAM home on the machine shares
# The measurement is repeated until the best two rounds of each number agree within
# `AGREE` (a neighbour's load only makes a round low), in `ROUNDS` rounds at least and most.
AGREE = 0.10
ROUNDS = (2, 4)
MEASURE_TIMEOUT_S = 600.0
WORK_TIMEOUT_S = 120.0
WORK_SCHEMA = 2  # bump when what `count_work` counts changes: kept counts are redone
FASTER_THAN_LIGHT = 1.10  # fraction of the roofline time that is "well above" 100 %
NEAR_LIMIT = 0.9  # at or above this fraction a kernel is near its bound
MIB = 1 << 20
# Bytes of one array in the bandwidth curve: L1/L2-sized to well past the last level cache.
CURVE_BYTES = (256 << 10, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 512 * MIB)
NUMPY_COPY_BYTES = 256 * MIB
GEMM_N = {"1": 1024, "all": 2048}
# Independent FMA chains in registers (12 zmm with AVX-512, 6 x 2 ymm otherwise): no
# honest kernel does more FP32 FLOPs a second on one core.
FMA_SOURCE = r"""
#if defined(__AVX512F__)
enum { chains = 12, lanes = 16 };
#else
enum { chains = 6, lanes = 16 };
#endif
extern "C" long fma_flops_per_iteration() { return 2L * chains * lanes; }
extern "C" float fma_chains(long iterations, float m, float c) {
    float acc[chains][lanes];
    for (int a = 0; a < chains; ++a)
        for (int l = 0; l < lanes; ++l) acc[a][l] = 0.001f * (a + l);
    for (long it = 0; it < iterations; ++it)
        for (int a = 0; a < chains; ++a)
#pragma omp simd
            for (int l = 0; l < lanes; ++l) acc[a][l] = acc[a][l] * m + c;
    float sum = 0.0f;
    for (int a = 0; a < chains; ++a)
        for (int l = 0; l < lanes; ++l) sum += acc[a][l];
    return sum;
}
"""
FMA_ITERATIONS = 200_000  # about 0.3 ms a run: many short runs find a quiet moment
# Cephes' expf (Cody-Waite reduction by ln 2, a degree-5 polynomial, 2^n from the exponent
# bits; only the low clamp a softmax needs), vectorized by GCC at the ISA's width, over an
# array in L1: the exps a second an honest kernel's exp reaches (GCC's libmvec expf was
# 15-25 % slower on an AVX-512 EPYC). A vector division or square root ran 2-3x faster
# than it there, so those are not special functions (`special_ops`).
EXP_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
static inline float exp_poly(float x) {
    x = fmaxf(x, -87.0f);
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
enum { n = 2048 };
extern "C" long exps_per_call(long repeats) { return repeats * n; }
extern "C" float exp_loop(long repeats) {
    alignas(64) float x[n];
    for (int i = 0; i < n; ++i) x[i] = 0.001f * i;
    for (long it = 0; it < repeats; ++it)
#pragma omp simd
        for (int i = 0; i < n; ++i) x[i] = exp_poly(-0.5f * x[i]);
    return x[0] + x[n - 1];
}
"""
EXP_REPEATS = 500  # about 0.25 ms a run at 4 G exps/s
# FP32 results a clock of one SM's special function units (MUFU: exp2, log2, reciprocal,
# rsqrt, sin, cos), the CUDA C++ Programming Guide's "Throughput of Native Arithmetic
# Instructions": 32 on compute capability 5.x, 6.1 and 6.2, 16 on 6.0 and from 7.0 on
# (H100 SXM: 132 SMs x 16 x 1.83 GHz, the 3.9 T special ops/s FlashAttention-3 works
# against). An exp is one MUFU.EX2 after a multiply.
SFU_PER_SM_CLOCK = {(5, 0): 32, (5, 2): 32, (5, 3): 32, (6, 1): 32, (6, 2): 32}
SFU_DEFAULT_PER_SM_CLOCK = 16
# FP32 lanes of one FMA for the widest vector ISA the flags name.
_ISA_LANES = (
    ("avx512f", "avx512", 16),
    ("avx2", "avx2", 8),
    ("sve", "sve", 4),
    ("asimd", "neon", 4),
)


@dataclass(frozen=True)
class MachineLimits:
    """What this machine can do, measured (see the module docstring)."""

    fingerprint: str
    cpu: str
    isa: str
    fp32_lanes: int
    cores: int
    # per thread setting ("1", "all"): [[bytes of one array, GB/s], ...], ascending
    bandwidth: dict[str, list[list[float]]]
    peak_gflops: dict[str, float]  # fp32 GEMM, per thread setting
    numpy_copy_gbs: float  # numpy copying a 256 MiB array on one core, for comparison
    # G exps a second of `EXP_SOURCE`, per thread setting ({}: measured before it was)
    special_gops: dict[str, float] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    load: float = 0.0  # the load average as it was measured (a neighbour makes it low)
    # each round's `headline` numbers, and whether the best two of each agreed (`AGREE`)
    rounds: list[dict[str, float]] = field(default_factory=list)
    stable: bool = False
    schema: int = SCHEMA

    def bandwidth_at(self, footprint: int, threads: str = "1") -> float:
        """GB/s streaming `footprint` bytes: the curve's point of the smallest working set
        that holds it (a copy's working set is two arrays), else its largest."""
        curve = self.bandwidth[threads]
        for size, gbs in curve:
            if footprint <= 2 * size:
                return gbs
        return curve[-1][1]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineLimits:
        """The limits in `data` (a key this version does not know is ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Work:
    """A task's minimal work: bytes that must move once, counted FLOPs and special
    functions (a count kept before they were counted reads as none)."""

    inputs: int
    outputs: int
    parameters: int
    flops: int
    special_ops: int = 0
    why: str = ""  # set when the work is unknown (the reference does not run on meta)

    @property
    def bytes(self) -> int:
        return self.inputs + self.outputs + self.parameters

    @property
    def known(self) -> bool:
        return not self.why


# ---------------------------------------------------------------- the machine's identity
def cpu_isa() -> tuple[str, str, int]:
    """(CPU model, widest vector ISA with FMA, FP32 lanes of one FMA)."""
    facts = machine.cpu_facts()
    for flag, isa, lanes in _ISA_LANES:
        if flag in facts.isa and (flag != "avx2" or "fma" in facts.isa):
            return facts.cpu, isa, lanes
    return facts.cpu, "scalar", 1


def _gpu_models() -> list[str]:
    models = []
    for info in sorted(machine.NVIDIA_GPUS.glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                models.append(line.split(":", 1)[1].strip())
    return models


def fingerprint() -> str:
    """What the limits depend on: CPU model and ISA, cores, memory, GPUs, torch's build."""
    model, isa, _ = cpu_isa()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    parts = [
        str(SCHEMA), platform.machine(), model, isa, str(len(os.sched_getaffinity(0))),
        str(round(pages / 2**30)), ",".join(_gpu_models()), torch_version,
    ]  # fmt: skip
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the cached limits
def machine_dir() -> Path:
    """The folder the limits are kept in for every HTAM home on this machine:
    `HTAM_MACHINE_DIR`, else the user's cache folder's `htam/machine` (not created here)."""
    if override := os.environ.get(MACHINE_DIR_ENV):
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("htam", appauthor=False)) / "machine"


def cached_path() -> Path:
    """Where the limits are kept: `HTAM_MACHINE_LIMITS` (a file, e.g. one measurement
    shared by a test session's homes), else `machine_dir()/<fingerprint>.json`."""
    if kept := os.environ.get(LIMITS_ENV):
        return Path(kept)
    return machine_dir() / f"{fingerprint()}.json"


def cached_limits() -> MachineLimits | None:
    """This machine's limits if measured before (by any HTAM home), else None."""
    try:
        limits = MachineLimits.from_json(json.loads(cached_path().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return limits if (limits.schema, limits.fingerprint) == (SCHEMA, fingerprint()) else None


def machine_limits(refresh: bool = False) -> MachineLimits:
    """This machine's limits: the cached ones, or measured now (`_measured`: rounds of
    seconds each, under the timing lock, so never beside a timing) and kept. A
    neighbour's load only ever makes a measurement low, so a new one is merged with what
    is kept (read again just before: another home may have measured meanwhile) by the best
    of each number. `RuntimeError` if the measurement fails."""
    old = cached_limits()
    if not refresh and old is not None:
        return old
    limits = _measured()
    if (kept := cached_limits()) is not None:
        limits = _best_of(kept, limits)
    path = cached_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(limits.to_json(), indent=1))
    return limits


def _measured() -> MachineLimits:
    """Rounds of the measurement (each a fresh child) until the best two of every
    `headline` number agree within `AGREE`, or `ROUNDS[1]` of them: the best of each
    number, with every round's numbers kept."""
    least, most = ROUNDS
    rounds: list[MachineLimits] = []
    numbers: list[dict[str, float]] = []
    while len(rounds) < most and (len(rounds) < least or unsettled(numbers)):
        done = _child(["measure"], "", MEASURE_TIMEOUT_S)
        rounds.append(MachineLimits.from_json({**done, "fingerprint": fingerprint()}))
        numbers.append(headline(rounds[-1]))
    best = rounds[0]
    for later in rounds[1:]:
        best = _best_of(best, later)
    return replace(best, rounds=numbers, stable=not unsettled(numbers))


def headline(limits: MachineLimits) -> dict[str, float]:
    """The numbers a verdict is held to (one thread): the bandwidth at each working set,
    the FP32 peak and the exp rate (where measured), by name."""
    found = {f"{_size(size)} GB/s": gbs for size, gbs in limits.bandwidth["1"]}
    found["FP32 GFLOP/s"] = limits.peak_gflops["1"]
    if exps := limits.special_gops.get("1"):
        found["exp Gexp/s"] = exps
    return found


def unsettled(rounds: list[dict[str, float]]) -> list[str]:
    """The headline numbers of `rounds` (each round's `headline`) whose best two rounds
    differ by more than `AGREE`: every one while there are fewer than two rounds."""
    found = []
    for name in rounds[0] if rounds else {}:
        top = sorted((r.get(name, 0.0) for r in rounds), reverse=True)
        if len(top) < 2 or top[1] < (1 - AGREE) * top[0]:
            found.append(name)
    return found


def spread(limits: MachineLimits) -> dict[str, float]:
    """Each headline number's spread over the kept rounds: (highest - lowest) / highest."""
    found = {}
    for name in limits.rounds[0] if limits.rounds else {}:
        values = [r[name] for r in limits.rounds if name in r]
        found[name] = (max(values) - min(values)) / max(values) if max(values) > 0 else 0.0
    return found


def _best_of(old: MachineLimits, new: MachineLimits) -> MachineLimits:
    """`new` with each bandwidth point and peak the higher of the two measurements."""
    bandwidth = {}
    for threads, curve in new.bandwidth.items():
        before = {size: gbs for size, gbs in old.bandwidth.get(threads, [])}
        bandwidth[threads] = [[size, max(gbs, before.get(size, 0.0))] for size, gbs in curve]
    peaks = {k: max(v, old.peak_gflops.get(k, 0.0)) for k, v in new.peak_gflops.items()}
    special = {k: max(v, old.special_gops.get(k, 0.0)) for k, v in new.special_gops.items()}
    numpy_copy = max(new.numpy_copy_gbs, old.numpy_copy_gbs)
    return replace(
        new,
        bandwidth=bandwidth,
        peak_gflops=peaks,
        special_gops=special,
        numpy_copy_gbs=numpy_copy,
    )


def _child(argv: list[str], stdin: str, timeout: float) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "htam_engine.roofline", *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=machine.trusted_env(),
        )
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError) as error:
        raise RuntimeError(f"roofline {argv[0]} failed: {type(error).__name__}") from None
    if "error" in found:
        raise RuntimeError(f"roofline {argv[0]} failed: {found['error']}")
    return found


# ---------------------------------------------------------------- the task's work
def task_work(reference_source: str) -> Work:
    """The minimal work of the reference: the count kept for it (a judge's, `keep_work`),
    else one on meta tensors in a child, kept."""
    if (kept := kept_work(reference_source)) is not None:
        return kept
    try:
        work = Work(**_child(["work"], reference_source, WORK_TIMEOUT_S))
    except (RuntimeError, TypeError) as error:
        return Work(0, 0, 0, 0, why=str(error))
    keep_work(reference_source, work)
    return work


def _work_path(reference_source: str) -> Path:
    """By content and `WORK_SCHEMA`: a count from before special functions were counted is
    counted again."""
    digest = hashlib.sha256(reference_source.encode()).hexdigest()[:24]
    return subdir("work") / f"{digest}.{WORK_SCHEMA}.json"


def kept_work(reference_source: str) -> Work | None:
    """The work kept for this reference (under the HTAM home, by its content)."""
    return read_work(_work_path(reference_source))


def keep_work(reference_source: str, work: Work) -> None:
    """Keep `work` for this reference: a judge counts a reference once (about a second
    of its start: `FlopCounterMode`'s first use)."""
    write_whole(_work_path(reference_source), json.dumps(asdict(work)))


# ---------------------------------------------------------------- a verdict's place
@dataclass(frozen=True)
class Bound:
    """The limits a verdict is held to: bandwidth at its footprint, peak, and the exp rate
    (0: not measured, so special functions bind nothing)."""

    bandwidth_gbs: float
    peak_gflops: float
    where: Where
    special_gops: float = 0.0


def bound_for(work: Work, limits: MachineLimits, device: str = "cpu") -> Bound | None:
    """The timing policy's limits for `work` on `device`: one CPU thread, or the GPU
    (None where the GPU was not measured)."""
    if device == "cuda":
        gpu = limits.gpu
        if not gpu:
            return None
        peak = gpu["peak_tflops"]["fp32"] * 1e3
        return Bound(gpu["bandwidth_gbs"], peak, "GPU", gpu.get("special_gops", 0.0))
    bandwidth = limits.bandwidth_at(work.bytes, "1")
    return Bound(bandwidth, limits.peak_gflops["1"], "core", limits.special_gops.get("1", 0.0))


def roofline_ms(work: Work, bound: Bound) -> tuple[float, Limiting]:
    """(the roofline time in ms, the bound that sets it: memory, compute or special)."""
    times: dict[Limiting, float] = {
        "memory": _ms(work.bytes, bound.bandwidth_gbs),
        "compute": _ms(work.flops, bound.peak_gflops),
        "special": _ms(work.special_ops, bound.special_gops),
    }
    limiting = max(times, key=lambda name: times[name])  # the first of a tie: memory
    return times[limiting], limiting


def _ms(amount: float, giga_per_s: float) -> float:
    """Milliseconds for `amount` at `giga_per_s` G a second (none at an unmeasured rate)."""
    return amount / (giga_per_s * 1e9) * 1e3 if giga_per_s > 0 else 0.0


def place(
    work: Work,
    bound: Bound,
    runtime_ms: float,
    ref_runtime_ms: float | None = None,
    slowest_ms: float | None = None,
    harness_ms: float = 0.0,
) -> Placement | None:
    """A timed kernel on the roofline (the verdict's `roofline`, None when the work is
    unknown): achieved GB/s and GFLOP/s, the special functions and the exp rate they are
    held to, the bound, the fraction of the fastest call this machine allows achieved (the
    roofline time plus `harness_ms`, the harness's own work inside every timed call: by
    the candidate, and by the reference), and whether even the slow end of its interval
    (`slowest_ms`) is faster than light (the roofline time alone: the harness's share is
    measured under the same load)."""
    if not work.known or runtime_ms <= 0 or work.bytes <= 0:
        return None
    best_ms, limiting = roofline_ms(work, bound)
    fastest_call = best_ms + harness_ms
    seconds = runtime_ms / 1e3
    slowest = slowest_ms if slowest_ms is not None else runtime_ms
    return Placement(
        bytes=work.bytes,
        flops=work.flops,
        bound=limiting,
        where=bound.where,
        bandwidth_gbs=round(bound.bandwidth_gbs, 3),
        peak_gflops=round(bound.peak_gflops, 3),
        roofline_ms=best_ms,
        achieved_gbs=round(work.bytes / seconds / 1e9, 3),
        achieved_gflops=round(work.flops / seconds / 1e9, 3),
        fraction=round(fastest_call / runtime_ms, 4),
        reference_fraction=round(fastest_call / ref_runtime_ms, 4) if ref_runtime_ms else None,
        faster_than_light=best_ms / slowest > FASTER_THAN_LIGHT,
        special_ops=work.special_ops,
        special_gops=round(bound.special_gops, 3) if bound.special_gops > 0 else None,
        harness_ms=round(harness_ms, 4) if harness_ms > 0 else None,
    )


_REMEASURED: set[Path] = set()  # the kept limits this process measured again


def for_verdict(
    reference_source: str,
    verdict: Verdict,
    versus_reference: bool = True,
    work: Work | None = None,
) -> None:
    """Set a timed `verdict`'s `roofline` (and `suspect` when it is faster than light),
    measuring this machine first if it never was. Light is suspected before the
    candidate: a faster-than-light verdict measures the machine again (limits only ever
    rise) and only then is it suspect. `work` is the judge's count where it made one.
    Never fails a verdict: an unknown work or a failed measurement says why."""
    if not verdict.runtime_ms or verdict.interval is None:
        return
    work = work or task_work(reference_source)  # the judge's count, else one on meta
    try:
        limits = machine_limits()
        bound = bound_for(work, limits, verdict.device)
    except (RuntimeError, TypeError, KeyError, ValueError) as error:  # never the verdict's
        verdict.roofline = Unplaced(f"the machine's limits: {error}"[:300])
        return
    if bound is None or not work.known:
        verdict.roofline = Unplaced(work.why or "the GPU's limits were not measured")
        return
    # the slow end of the candidate's time: its time at the speedup's lower bound
    slowest = verdict.runtime_ms * verdict.interval.estimate / max(verdict.interval.low, 1e-12)
    ref_ms = verdict.ref_runtime_ms if versus_reference else None
    harness = verdict.spread.get("harness_ms", 0.0)
    placed = place(work, bound, verdict.runtime_ms, ref_ms, slowest, harness)
    if placed is None:  # the task moves no bytes: nothing to hold it to
        verdict.roofline = None
        return
    # PyTorch beating light says the same: the limits were measured under a load
    light = (placed.reference_fraction or 0) > FASTER_THAN_LIGHT
    if (placed.faster_than_light or light) and cached_path() not in _REMEASURED:
        _REMEASURED.add(cached_path())  # once: a measurement takes seconds
        bound = bound_for(work, machine_limits(refresh=True), verdict.device) or bound
        placed = place(work, bound, verdict.runtime_ms, ref_ms, slowest, harness) or placed
    verdict.roofline = replace(placed, machine=limits.fingerprint)
    verdict.suspect = verdict.suspect or placed.faster_than_light


def replace_on_kept(verdict: Verdict) -> None:
    """A cached `verdict`'s roofline placed again on the limits kept now (they only rise
    after it was stored), so a run's numbers share one machine; nothing is measured."""
    light = verdict.roofline
    limits = cached_limits()
    if not isinstance(light, Placement) or limits is None or not verdict.runtime_ms:
        return
    work = Work(light.bytes, 0, 0, light.flops, special_ops=light.special_ops or 0)
    bound = bound_for(work, limits, verdict.device)
    if bound is None:
        return
    ref_ms = verdict.ref_runtime_ms if light.reference_fraction is not None else None
    harness = light.harness_ms or 0.0
    if (placed := place(work, bound, verdict.runtime_ms, ref_ms, harness_ms=harness)) is None:
        return
    # the interval's slow end is not kept: the stored flag stands
    verdict.roofline = replace(
        placed, faster_than_light=light.faster_than_light, machine=limits.fingerprint
    )


def describe(roofline: Placement | Unplaced | None, short: bool = False) -> str:
    """ "at 61 % of this core's memory bandwidth (12.1 of 19.8 GB/s)", "at 62 % of this
    core's exp throughput (2.5 of 4.08 Gexp/s)"; with the harness's share counted, "at 76 %
    of this core's FP32 peak (51.3 of 118 GFLOP/s over the whole call: its floor 1.14 ms +
    the harness's 0.85 ms a call)"; "" when not placed."""
    if not isinstance(roofline, Placement):
        return ""
    what, got, limit, unit = _held_to(roofline)
    where = "this GPU's" if roofline.where == "GPU" else "this core's"
    text = f"at {100 * roofline.fraction:.0f} % of {where} {what}"
    if short:
        return text
    if roofline.harness_ms:
        text += (
            f" ({got:.3g} of {limit:.3g} {unit} over the whole call: its floor "
            f"{roofline.roofline_ms:.3g} ms + the harness's {roofline.harness_ms:.2g} ms a call)"
        )
    else:
        text += f" ({got:.3g} of {limit:.3g} {unit})"
    if over_told(roofline):
        text += " - the harness's share was told too high on a busy machine"
    elif fewer_specials(roofline):
        text += " - fewer special functions than the reference computes"
    return text + (" - faster than light" if roofline.faster_than_light else "")


def _held_to(roofline: Placement) -> tuple[str, float, float, str]:
    """(the limit's name, what was achieved over the call, the limit, the unit) of the
    binding bound."""
    if roofline.bound == "memory":
        return "memory bandwidth", roofline.achieved_gbs, roofline.bandwidth_gbs, "GB/s"
    if roofline.bound == "special":
        rate = roofline.special_gops or 0.0  # it binds only where measured
        call_ms = (roofline.roofline_ms + (roofline.harness_ms or 0.0)) / roofline.fraction
        return "exp throughput", (roofline.special_ops or 0) / call_ms / 1e6, rate, "Gexp/s"
    return "FP32 peak", roofline.achieved_gflops, roofline.peak_gflops, "GFLOP/s"


def tags(roofline: Placement | Unplaced | None) -> list[str]:
    """State tags: `memory_bound` / `compute_bound` (special functions are arithmetic too),
    and `near_limit` at 90 % or more, unless the harness's share was told too high or the
    code computes fewer special functions than the reference's count."""
    if not isinstance(roofline, Placement):
        return []
    found = ["memory_bound" if roofline.bound == "memory" else "compute_bound"]
    near = roofline.fraction >= NEAR_LIMIT
    past = over_told(roofline) or fewer_specials(roofline)
    return found + (["near_limit"] if near and not past else [])


def fewer_specials(roofline: Placement) -> bool:
    """Past 100 % of the special-function limit: the code computes fewer of them than the
    reference's count (one log of a ratio for a KL divergence's two logs), so that count
    is no limit of its own (a model's first KL divergence was stopped "at 105 % of this
    core's exp throughput" with every step left)."""
    return roofline.bound == "special" and roofline.fraction > 1.0


def over_told(roofline: Placement) -> bool:
    """Past the limit only with the harness's share counted: that share was told too
    high (neighbours' time the books missed), and the fraction says nothing of the limit
    (a GEMM at "122 % of FP32 peak" was stopped "at the limit")."""
    return bool(roofline.harness_ms) and roofline.fraction > FASTER_THAN_LIGHT


# ---------------------------------------------------------------- `htam machine`
def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "machine",
        help="this machine's limits (bandwidth, peak FLOP/s, exps/s), measured once and cached",
        description=(
            "Print the memory bandwidth, peak FP32 FLOP/s and exps a second this machine "
            "reaches with one thread and with all cores (and its GPU's), which every timed "
            "verdict is placed against. Measured on first use, in rounds until the best two "
            "agree, and kept for every HTAM home on this machine (the user's cache folder, "
            f"or ${MACHINE_DIR_ENV})."
        ),
    )
    parser.add_argument("--refresh", action="store_true", help="measure again (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        limits = machine_limits(refresh=args.refresh)
    except RuntimeError as error:
        raise UserError(str(error)) from None
    if args.json:
        print(json.dumps(limits.to_json()))
    else:
        print(_human(limits), file=sys.stderr)
    return 0


def _size(size: float) -> str:
    return f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB"


def _human(limits: MachineLimits) -> str:
    lines = [
        f"{limits.cpu}: {limits.isa} ({limits.fp32_lanes} FP32 lanes per FMA), "
        f"{limits.cores} cores; measured {limits.measured_at} [{limits.fingerprint}]",
        "memory bandwidth, GB/s (best of copy, triad and memcpy; working set of one array):",
        "  " + "".join(f"{_size(size):>10}" for size, _ in limits.bandwidth["1"]),
    ]
    for threads, label in (("1", "1 thread"), ("all", "all cores")):
        values = "".join(f"{gbs:>10.1f}" for _, gbs in limits.bandwidth[threads])
        lines.append(f"  {values}  {label}")
    lines.append(
        f"numpy copying {_size(NUMPY_COPY_BYTES)} on one core: {limits.numpy_copy_gbs:.1f} GB/s"
    )
    peaks = limits.peak_gflops
    lines.append(
        f"peak FP32 (GEMM): {peaks['1']:.1f} GFLOP/s 1 thread, {peaks['all']:.1f} all cores"
    )
    if exps := limits.special_gops:
        lines.append(
            f"exp (special functions): {exps['1']:.2f} Gexp/s 1 thread, {exps['all']:.2f} all cores"
        )
    if gpu := limits.gpu:
        tflops = ", ".join(f"{k} {v} TFLOP/s" for k, v in gpu["peak_tflops"].items())
        special = f", {gpu['special_gops']:g} Gexp/s" if gpu.get("special_gops") else ""
        lines.append(
            f"GPU {gpu['name']} (sm {gpu['sm']}): {gpu['bandwidth_gbs']} GB/s, {tflops}{special}"
        )
    lines.append("verdicts use the 1-thread limits (the timing policy: one thread per side)")
    lines += _rounds(limits)
    if limits.load > limits.cores / 2:
        lines.append(
            f"measured at a load average of {limits.load:g} on {limits.cores} cores: the numbers "
            "may be low; `htam machine --refresh` on a quiet machine raises them"
        )
    return "\n".join(lines)


def _rounds(limits: MachineLimits) -> list[str]:
    """How stable the 1-thread numbers were: each round's value and the spread."""
    apart = unsettled(limits.rounds)
    agreement = f"the best two of {'all but ' + ', '.join(apart) if apart else 'each'} agreed"
    lines = [
        f"measured in {len(limits.rounds)} rounds ({agreement} within {100 * AGREE:.0f} %; "
        f"the best of each kept), for every HTAM home on this machine: {cached_path()}"
    ]
    for name, share in spread(limits).items():
        values = ", ".join(f"{r[name]:.3g}" for r in limits.rounds if name in r)
        lines.append(f"  {name:>14}: {values} (spread {100 * share:.0f} %)")
    return lines


def summary(limits: MachineLimits) -> str:
    """One line for an editor: "one core: 22.2 GB/s past the caches, 118 GFLOP/s FP32,
    4.17 Gexp/s; 3 rounds, spread up to 9 % (stable)"."""
    numbers = [
        f"{limits.bandwidth['1'][-1][1]:.3g} GB/s past the caches",
        f"{limits.peak_gflops['1']:.3g} GFLOP/s FP32",
    ]
    if exps := limits.special_gops.get("1"):
        numbers.append(f"{exps:.3g} Gexp/s")
    text = "one core: " + ", ".join(numbers)
    if gpu := limits.gpu:
        text += f"; GPU {gpu['name']}: {gpu['bandwidth_gbs']:.4g} GB/s"
    widest = max(spread(limits).values(), default=0.0)
    state = "stable" if limits.stable else "not stable: `htam machine --refresh` on a quiet machine"
    return text + f"; {len(limits.rounds)} rounds, spread up to {100 * widest:.0f} % ({state})"


# ---------------------------------------------------------------- the measuring child
def _best_rate(run: Any, amount: float, min_s: float = 0.05, reps: int = 5) -> float:
    """`amount` per second of the fastest of at least `reps` runs of `run()` (and at least
    `min_s` of them in all)."""
    best, spent, count = math.inf, 0.0, 0
    run()  # first touch, warm caches
    while count < reps or spent < min_s:
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best, spent, count = min(best, took), spent + took, count + 1
    return amount / best


def _arrays(torch: Any) -> tuple[Any, Any, Any]:
    """Three float32 arrays of the curve's largest size, touched once: every point of the
    curve (and numpy's copy) runs on a prefix of them."""
    n = CURVE_BYTES[-1] // 4
    return torch.full((n,), 1.0), torch.full((n,), 2.0), torch.full((n,), 3.0)


def _bandwidth_curve(torch: Any, arrays: tuple[Any, Any, Any]) -> list[list[float]]:
    """GB/s per working set: the best of torch's copy and triad and of memcpy (numpy's
    copy: past the cache glibc stores around it, saving the read a plain store makes, so
    a kernel with such stores can beat a plain copy by up to 1.5x)."""
    import numpy as np

    curve = []
    for size in CURVE_BYTES:
        a, b, c = (array[: size // 4] for array in arrays)
        an, bn = a.numpy(), b.numpy()
        copy = _best_rate(lambda a=a, b=b: b.copy_(a), 2 * size)
        triad = _best_rate(lambda a=a, b=b, c=c: torch.add(b, c, alpha=3.0, out=a), 3 * size)
        memcpy = _best_rate(lambda an=an, bn=bn: np.copyto(bn, an), 2 * size)
        curve.append([size, round(max(copy, triad, memcpy) / 1e9, 3)])
    return curve


def _gemm_gflops(torch: Any, n: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return _best_rate(lambda: torch.mm(a, b, out=out), 2.0 * n**3, min_s=0.1) / 1e9


def _fma_gflops() -> float:
    """The best rate of `FMA_SOURCE`'s chains over many short runs (0 without g++)."""
    import ctypes

    from htam_engine.kernels import CompileError, load_cpp

    try:
        lib = load_cpp("htam_fma_peak", FMA_SOURCE, ["-O3", "-march=native", "-fopenmp-simd"])
    except (CompileError, OSError):  # no compiler: torch's GEMM stands alone
        return 0.0
    lib.fma_chains.argtypes = [ctypes.c_long, ctypes.c_float, ctypes.c_float]
    lib.fma_chains.restype = ctypes.c_float
    flops = FMA_ITERATIONS * lib.fma_flops_per_iteration()
    run = lambda: lib.fma_chains(FMA_ITERATIONS, 0.9999, 0.0001)  # noqa: E731
    return _best_rate(run, flops, min_s=0.2, reps=50) / 1e9


def _exp_lib() -> Any:
    """`EXP_SOURCE` loaded (None without g++: special functions then bind nothing)."""
    import ctypes

    from htam_engine.kernels import CompileError, load_cpp

    flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]
    try:
        lib = load_cpp("htam_exp_peak", EXP_SOURCE, flags)
    except (CompileError, OSError):
        return None
    lib.exp_loop.argtypes = [ctypes.c_long]
    lib.exp_loop.restype = ctypes.c_float
    return lib


def _exp_gops(lib: Any, threads: int) -> float:
    """G exps a second of `threads` threads each running the exp loop (ctypes lets go of
    the GIL in the call), the best of many short runs; 0 without the loop."""
    if lib is None:
        return 0.0
    from concurrent.futures import ThreadPoolExecutor

    amount = threads * lib.exps_per_call(EXP_REPEATS)
    if threads == 1:  # no pool's hand-over in the time
        return round(_best_rate(lambda: lib.exp_loop(EXP_REPEATS), amount, 0.2, 50) / 1e9, 3)
    with ThreadPoolExecutor(threads) as pool:
        run = lambda: list(pool.map(lib.exp_loop, [EXP_REPEATS] * threads))  # noqa: E731
        return round(_best_rate(run, amount, 0.2, 50) / 1e9, 3)


def _numpy_copy_gbs(arrays: tuple[Any, Any, Any]) -> float:
    """numpy copying a 256 MiB array into another (numpy's own memcpy, one thread)."""
    import numpy as np

    n = NUMPY_COPY_BYTES // 4
    a, b = arrays[0].numpy()[:n], arrays[1].numpy()[:n]
    return round(_best_rate(lambda: np.copyto(b, a), 2 * NUMPY_COPY_BYTES) / 1e9, 3)


def _gpu(torch: Any) -> dict[str, Any]:
    """The first GPU: its properties, copy bandwidth and GEMM peaks (FP32 without TF32,
    FP16 on tensor cores), timed with CUDA events."""
    if not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(0)

    def timed(run: Any, amount: float) -> float:
        run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = math.inf
        for _ in range(10):
            start.record()
            run()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return amount / best

    n = 256 * MIB
    a, b = (
        torch.empty(n, dtype=torch.uint8, device="cuda"),
        torch.empty(n, dtype=torch.uint8, device="cuda"),
    )
    bandwidth = timed(lambda: b.copy_(a), 2 * n) / 1e9
    torch.backends.cuda.matmul.allow_tf32 = False
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("fp16_tensor", torch.float16)):
        x = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        peaks[name] = round(timed(lambda x=x: torch.mm(x, x), 2.0 * 8192**3) / 1e12, 2)
    return {
        "name": props.name,
        "sm": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_gb": round(props.total_memory / 1e9, 1),
        "bandwidth_gbs": round(bandwidth, 1),
        "peak_tflops": peaks,
        # the rated SM clock, kHz (a torch without it: special functions bind nothing)
        "special_gops": sfu_gops(props, getattr(props, "clock_rate", 0)),
    }


def sfu_gops(props: Any, clock_khz: float) -> float:
    """G special function results a second of a GPU's SFUs (`SFU_PER_SM_CLOCK`) at the
    clock `clock_khz`; `props` has the compute capability and SM count."""
    capability = (props.major, props.minor)
    per_clock = SFU_PER_SM_CLOCK.get(capability, SFU_DEFAULT_PER_SM_CLOCK)
    return round(props.multi_processor_count * per_clock * clock_khz / 1e6, 1)


def measure() -> dict[str, Any]:
    """In the child: every limit, measured under the CPU timing lock."""
    import torch

    from htam_engine.evaluate.process import quietest_core, timing_lock

    model, isa, lanes = cpu_isa()
    cores = sorted(os.sched_getaffinity(0))
    found: dict[str, Any] = {"cpu": model, "isa": isa, "fp32_lanes": lanes, "cores": len(cores)}
    with timing_lock("cpu"):
        os.sched_setaffinity(0, {quietest_core()})
        torch.set_num_threads(1)
        arrays = _arrays(torch)
        one = _bandwidth_curve(torch, arrays), _gemm_gflops(torch, GEMM_N["1"])
        fma, exp_lib = _fma_gflops(), _exp_lib()
        exps = {"1": _exp_gops(exp_lib, 1)}
        numpy_copy = _numpy_copy_gbs(arrays)
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
        every = _bandwidth_curve(torch, arrays), _gemm_gflops(torch, GEMM_N["all"])
        exps["all"] = max(_exp_gops(exp_lib, len(cores)), exps["1"])
        del arrays
        gpu = _gpu(torch)
    found["bandwidth"] = {"1": one[0], "all": every[0]}
    # all cores: at least one core's chains (the probe runs on one)
    found["peak_gflops"] = {"1": round(max(one[1], fma), 3), "all": round(max(every[1], fma), 3)}
    found["numpy_copy_gbs"] = numpy_copy
    found["special_gops"] = exps
    found["gpu"] = gpu
    found["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    found["load"] = round(os.getloadavg()[0], 2)
    return found


def _work(source: str) -> dict[str, Any]:
    """In the child: the reference's work on meta tensors (nothing allocated)."""
    import shutil
    import tempfile

    import torch

    from htam_engine.evaluate import common

    folder = Path(tempfile.mkdtemp(prefix="htam-work-"))
    try:
        (folder / "reference.py").write_text(source)
        with torch.device("meta"):
            module = common.import_file("htam_reference_work", folder / "reference.py")
            model = module.Model(*module.get_init_inputs())
            return count_work(model, list(module.get_inputs()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def count_work(model: Any, inputs: list[Any], device: Any = "meta") -> dict[str, int]:
    """`model`'s work on `inputs` (one forward under `FlopCounterMode` and a count of its
    special functions, on `device`)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    moved = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    counter, special = FlopCounterMode(display=False), _special_counter()
    with torch.no_grad(), counter, special:
        out = model(*moved)
    outputs = list(out) if isinstance(out, tuple | list) else [out]
    module_state = isinstance(model, torch.nn.Module)
    state = [*model.parameters(), *model.buffers()] if module_state else []
    return {
        "inputs": _unique_bytes(torch, moved),
        "outputs": _unique_bytes(torch, outputs),
        "parameters": _unique_bytes(torch, state),
        "flops": int(counter.get_total_flops()),
        "special_ops": special.count,
    }


# Special functions (`Work.special_ops`) of an aten op, a call per output element: each is
# at least an exp's work (the rate they are held to), so the time stays a lower bound.
# Softplus and a log-sigmoid are an exp and a log1p; a softmax is its exps (its one
# reciprocal a row is left out with divisions and square roots: see `EXP_SOURCE`).
_TRANSCENDENTAL = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "logit", "xlogy", "erf", "erfc",
    "erfinv", "lgamma", "digamma", "tanh", "sigmoid", "silu", "gelu", "glu", "mish", "elu",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh",
    "atanh", "_softmax", "_safe_softmax",
)  # fmt: skip
# Fused attention on (batch, heads, length, features): an exp a score.
_FUSED_ATTENTION = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
_SPECIAL_CALLS = dict.fromkeys(_TRANSCENDENTAL, 1) | {"softplus": 2, "log_sigmoid_forward": 2}


def special_ops(name: str, args: tuple[Any, ...], out: Any) -> int:
    """The special functions aten op `name` (an overload packet's name: `exp`, `exp_`,
    `_softmax`) computes on `args`, giving `out`."""
    name = name.rstrip("_")
    result = out[0] if isinstance(out, tuple | list) else out
    elements = int(result.numel()) if hasattr(result, "numel") else 0
    if name == "pow":
        return elements * _pow_calls(args[0], args[1])
    if name == "_log_softmax":  # an exp an element, a log a row
        rows = elements // result.size(args[1]) if result.dim() and elements else elements
        return elements + rows
    if name == "logsumexp":  # an exp an input element, a log an output one
        return int(args[0].numel()) + elements
    if name in _FUSED_ATTENTION:
        query, key = args[0], args[1]
        return int(query.numel()) // query.size(-1) * key.size(-2)
    return elements * _SPECIAL_CALLS.get(name, 0)


def _pow_calls(base: Any, exponent: Any) -> int:
    """x ** y is exp(y log x): none for an integer exponent (multiplies) or +-0.5 (a square
    root), one exp for a number's power, else two."""
    if isinstance(exponent, int | float):
        return 0 if float(exponent).is_integer() or abs(exponent) == 0.5 else 2
    return 1 if isinstance(base, int | float) else 2


def _special_counter() -> Any:
    """A dispatch mode counting the `special_ops` of every aten op run under it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class SpecialCounter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            self.count += special_ops(func.overloadpacket.__name__, args, out)
            return out

    return SpecialCounter()


def write_work(path: Path, model: Any, inputs: list[Any], device: Any) -> None:
    """In the judge (trusted, already holding the reference and an input set): the work,
    for the caller to read (`read_work`) without a process of its own. Nothing on failure."""
    try:
        path.write_text(json.dumps(count_work(model, inputs, device)))
    except Exception:  # a forward the counter cannot follow: the caller counts on meta
        return


def read_work(path: Path) -> Work | None:
    try:
        return Work(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _unique_bytes(torch: Any, values: list[Any]) -> int:
    """Bytes of the tensors in `values`, each distinct tensor once."""
    seen: dict[int, int] = {}
    for value in values:
        if isinstance(value, torch.Tensor):
            seen[id(value)] = value.numel() * value.element_size()
    return sum(seen.values())


def _main(argv: list[str]) -> None:
    try:
        if argv[:1] == ["measure"]:
            found = measure()
        elif argv[:1] == ["work"]:
            found = _work(sys.stdin.read())
        else:
            found = {"error": f"unknown command {argv}"}
    except Exception as error:  # the caller gets one line, never a traceback to parse
        found = {"error": f"{type(error).__name__}: {error}"[:500]}
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
