"""Speed of light that knows exp: special functions counted on the reference per output
element, this core's exp rate measured beside its FMA peak (the GPU's from its SFUs), a
floor that binds on them, and placements and counts older versions wrote still reading."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from htam_engine import roofline
from htam_engine.evaluate.verdict import Verdict
from htam_engine.paths import subdir
from htam_engine.placement import Placement
from htam_engine.roofline import Bound, MachineLimits, Work

R, C = 32, 48  # rows and columns of the counted references
MIB = 1 << 20


class Call(nn.Module):
    """A reference whose forward is one function."""

    def __init__(self, forward: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.call = forward

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.call(*inputs)


def _x() -> torch.Tensor:
    return torch.randn(R, C)


# (reference, its inputs, the special functions it must count), the count from the shapes
REFERENCES: dict[str, tuple[Callable[[], nn.Module], Callable[[], list[Any]], int]] = {
    "softmax": (lambda: Call(lambda x: torch.softmax(x, dim=1)), lambda: [_x()], R * C),
    "gelu": (nn.GELU, lambda: [_x()], R * C),  # an erf an element
    "gelu_tanh": (lambda: nn.GELU("tanh"), lambda: [_x()], R * C),
    "silu": (nn.SiLU, lambda: [_x()], R * C),  # an exp (its reciprocal is not one)
    "log_softmax": (lambda: nn.LogSoftmax(dim=1), lambda: [_x()], R * C + R),  # and a log a row
    "cross_entropy": (  # log-softmax over the classes, then a gather
        nn.CrossEntropyLoss,
        lambda: [_x(), torch.randint(0, C, (R,))],
        R * C + R,
    ),
    # a reciprocal square root a row, which runs faster than an exp: none
    "layer_norm": (lambda: nn.LayerNorm(C), lambda: [_x()], 0),
    "rms_norm": (lambda: nn.RMSNorm(C), lambda: [_x()], 0),
    # x**2 is a multiply, x**0.5 a square root, x**0.3 an exp and a log
    "pow": (
        lambda: Call(lambda x: x.abs() ** 2 + x.abs() ** 0.5 + x.abs() ** 0.3),
        lambda: [_x()],
        2 * R * C,
    ),
    "softplus": (nn.Softplus, lambda: [_x()], 2 * R * C),  # log1p(exp(x))
    "attention": (  # 2 batches x 3 heads, 8 queries x 5 keys: an exp a score
        lambda: Call(lambda q, k: F.scaled_dot_product_attention(q, k, k)),
        lambda: [torch.randn(2, 3, 8, 16), torch.randn(2, 3, 5, 16)],
        2 * 3 * 8 * 5,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_special_functions_are_counted_per_output_element(name: str, device: str) -> None:
    """The judge counts on the device it runs; the child on meta: the same count."""
    make, inputs, expected = REFERENCES[name]
    with torch.device(device):
        model = make()
    work = roofline.count_work(model, inputs(), device)
    assert work["special_ops"] == expected


def test_the_child_counts_the_special_functions_of_a_reference_on_meta() -> None:
    source = (
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.softmax(x, dim=-1)\n"
        f"def get_inputs():\n    return [torch.randn({R}, {C})]\n"
        "def get_init_inputs():\n    return []\n"
    )
    work = roofline.task_work(source)
    assert work.known, work.why
    assert (work.bytes, work.flops, work.special_ops) == (2 * R * C * 4, 0, R * C)
    assert roofline.kept_work(source) == work


def test_a_count_written_before_special_functions_were_counted_still_reads() -> None:
    """The judge's `work.json` of an older version reads with none; a count kept by
    content before is not believed (it would hide a softmax's exps), so it is redone."""
    path = subdir("work") / "old.json"
    old = {"inputs": 4096, "outputs": 4096, "parameters": 0, "flops": 0}
    path.write_text(json.dumps(old))
    assert roofline.read_work(path) == Work(4096, 4096, 0, 0, special_ops=0)
    source = "the reference's text"
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    (subdir("work") / f"{digest}.json").write_text(json.dumps(old))  # where it was kept
    assert roofline.kept_work(source) is None
    roofline.keep_work(source, Work(4096, 4096, 0, 0, special_ops=1024))
    assert roofline.kept_work(source) == Work(4096, 4096, 0, 0, special_ops=1024)


def _softmax_work(rows: int, columns: int) -> Work:
    return Work(rows * columns * 4, rows * columns * 4, 0, 0, special_ops=rows * columns)


def test_a_softmax_in_cache_is_bound_by_its_exps_on_this_machine() -> None:
    """On this machine's measured limits a softmax whose 256 KiB fit in L2 is held to its
    exps, not to the bytes it moves (an exp takes longer than streaming 8 bytes from L2),
    and the floor is their time at the measured exp rate."""
    limits = roofline.machine_limits()
    work = _softmax_work(64, 512)
    bound = roofline.bound_for(work, limits)
    assert bound is not None and bound.special_gops == limits.special_gops["1"] > 0
    best_ms, limiting = roofline.roofline_ms(work, bound)
    assert limiting == "special"
    assert best_ms == pytest.approx(64 * 512 / (bound.special_gops * 1e9) * 1e3)
    assert best_ms > work.bytes / (bound.bandwidth_gbs * 1e9) * 1e3  # more than its bytes'
    placed = roofline.place(work, bound, runtime_ms=2 * best_ms)
    assert placed is not None and placed.bound == "special" and placed.fraction == 0.5
    assert placed.special_ops == 64 * 512
    assert roofline.describe(placed, short=True) == "at 50 % of this core's exp throughput"


def test_the_exp_rate_is_measured_below_the_fma_peak_and_above_pytorch_s_exp() -> None:
    """One core's exps a second: positive, below its FMA peak (an exp is several FMAs),
    and at least what PyTorch's own vectorized exp reaches on an array in L1 (a lower
    limit would call PyTorch faster than light)."""
    torch.set_num_threads(1)
    exps = roofline._exp_gops(roofline._exp_lib(), 1)
    fma = roofline._fma_gflops()
    x, out = torch.randn(2048), torch.empty(2048)
    best = min(_timed(lambda: torch.exp(x, out=out)) for _ in range(2000))
    pytorch = 2048 / best / 1e9
    assert 0 < exps < fma / 2
    assert exps >= 0.9 * pytorch, (exps, pytorch)


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _limits(**changes: object) -> MachineLimits:
    """Round limits: 100 GB/s at every working set, 100 GFLOP/s, 2 G exps a second."""
    curve = [[64 * MIB, 100.0]]
    limits = MachineLimits(
        fingerprint=roofline.fingerprint(),
        cpu="test cpu",
        isa="avx512",
        fp32_lanes=16,
        cores=2,
        bandwidth={"1": curve, "all": curve},
        peak_gflops={"1": 100.0, "all": 200.0},
        numpy_copy_gbs=9.0,
        special_gops={"1": 2.0, "all": 4.0},
    )
    return replace(limits, **changes)  # type: ignore[arg-type]


def test_the_floor_is_the_largest_of_bytes_flops_and_special_functions() -> None:
    """8 MiB moved at 100 GB/s: 0.0839 ms; 1 MFLOP at 100 GFLOP/s: 0.01 ms; 1 M exps at
    2 G/s: 0.524 ms. Without the exp rate (limits measured before it) memory binds."""
    work = Work(4 * MIB, 4 * MIB, 0, 10**6, special_ops=MIB)
    bound = roofline.bound_for(work, _limits())
    assert bound == Bound(100.0, 100.0, "core", 2.0)
    assert roofline.roofline_ms(work, bound) == (pytest.approx(MIB / 2e9 * 1e3), "special")
    placed = roofline.place(work, bound, runtime_ms=MIB / 2e9 * 1e3 / 0.95)
    assert placed is not None and placed.special_gops == 2.0
    assert roofline.describe(placed) == "at 95 % of this core's exp throughput (1.9 of 2 Gexp/s)"
    assert roofline.tags(placed) == ["compute_bound", "near_limit"]
    fewer = roofline.place(work, bound, runtime_ms=MIB / 2e9 * 1e3 / 1.05)
    assert fewer is not None and roofline.tags(fewer) == ["compute_bound"]  # one log of two
    assert roofline.describe(fewer).endswith("fewer special functions than the reference computes")
    older = MachineLimits.from_json(
        {k: v for k, v in _limits().to_json().items() if k != "special_gops"}
    )
    unmeasured = roofline.bound_for(work, older)
    assert unmeasured.special_gops == 0.0
    assert roofline.roofline_ms(work, unmeasured)[1] == "memory"
    placed_older = roofline.place(work, unmeasured, runtime_ms=1.0)
    assert placed_older is not None and placed_older.special_gops is None
    assert "special_gops" not in placed_older.to_json()


def test_a_gpu_s_exp_rate_comes_from_its_specifications() -> None:
    """No GPU needed: the SFUs' rate from a device's properties (H100 SXM: 132 SMs, 16 a
    clock from compute capability 7.0 on; 32 on 6.1), and a GPU dict holding it. A
    logsumexp over fp16 on it still binds on memory: an SFU exp costs less than 2 bytes."""
    h100 = SimpleNamespace(major=9, minor=0, multi_processor_count=132)
    assert roofline.sfu_gops(h100, 1_980_000) == pytest.approx(132 * 16 * 1.98, abs=0.1)
    pascal = SimpleNamespace(major=6, minor=1, multi_processor_count=20)
    assert roofline.sfu_gops(pascal, 1_500_000) == pytest.approx(20 * 32 * 1.5)
    gpu = {
        "name": "H100",
        "sm": "9.0",
        "bandwidth_gbs": 3352.0,
        "peak_tflops": {"fp32": 51.2},
        "special_gops": roofline.sfu_gops(h100, 1_980_000),
    }
    rows, columns = 4096, 8192
    work = Work(rows * columns * 2, rows * 2, 0, 0, special_ops=rows * columns + rows)
    bound = roofline.bound_for(work, _limits(gpu=gpu), "cuda")
    assert bound == Bound(3352.0, 51200.0, "GPU", gpu["special_gops"])
    assert roofline.roofline_ms(work, bound)[1] == "memory"
    placed = roofline.place(work, bound, runtime_ms=1.0)
    assert placed is not None and placed.special_gops == gpu["special_gops"]
    assert placed.special_ops == rows * columns + rows
    assert (
        roofline.bound_for(work, _limits(gpu={**gpu, "special_gops": 0.0}), "cuda").special_gops
        == 0
    )


@pytest.mark.gpu
def test_a_measured_gpu_carries_its_sfu_rate_and_torch_s_exp_stays_under_it() -> None:
    """On a real GPU: the rate from its rated clock, and PyTorch's exp over an array in L2
    (4 MiB, 1000 times) no faster than the SFUs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    gpu = roofline._gpu(torch)
    props = torch.cuda.get_device_properties(0)
    assert gpu["special_gops"] == roofline.sfu_gops(props, props.clock_rate) > 0
    x = torch.randn(MIB, device="cuda")
    out = torch.empty_like(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.exp(x, out=out)
    start.record()
    for _ in range(1000):
        torch.exp(x, out=out)
    end.record()
    end.synchronize()
    exps_per_s = 1000 * MIB / (start.elapsed_time(end) / 1e3)
    assert exps_per_s <= 1.1 * gpu["special_gops"] * 1e9


# A placement as versions before special functions wrote it, and as this one does.
OLD = {
    "bytes": 33554432, "flops": 0, "bound": "memory", "where": "core",
    "bandwidth_gbs": 19.812, "peak_gflops": 98.5, "roofline_ms": 1.6936528017,
    "achieved_gbs": 12.084, "achieved_gflops": 0.0, "fraction": 0.6101,
    "reference_fraction": 0.4212, "faster_than_light": False, "machine": "0123456789abcdef",
}  # fmt: skip
NEW = OLD | {"bound": "special", "special_ops": 4194304, "special_gops": 4.08}


@pytest.mark.parametrize("stored", [OLD, NEW])
def test_a_placement_reads_and_writes_back_the_same_with_or_without_special_functions(
    stored: dict[str, Any],
) -> None:
    verdict = Verdict.from_json(json.loads(json.dumps({"compiled": True, "roofline": stored})))
    placed = verdict.roofline
    assert isinstance(placed, Placement)
    assert placed.special_ops == stored.get("special_ops")
    assert placed.special_gops == stored.get("special_gops")
    assert json.dumps(verdict.to_json()["roofline"]) == json.dumps(stored)


def test_a_stored_verdict_placed_again_keeps_its_special_functions() -> None:
    """`replace_on_kept` rebuilds the work from the placement: its exps still bind."""
    work = _softmax_work(1024, 4096)
    stored = Verdict(compiled=True, correct=True, runtime_ms=10.0, ref_runtime_ms=20.0)
    stored.roofline = roofline.place(work, Bound(100.0, 100.0, "core", 1.0), 10.0, 20.0)
    path = subdir("machine") / "kept.json"
    path.write_text(json.dumps(_limits().to_json()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(roofline.LIMITS_ENV, str(path))
        roofline.replace_on_kept(stored)
    placed = stored.roofline
    assert isinstance(placed, Placement) and placed.bound == "special"
    assert placed.roofline_ms == pytest.approx(1024 * 4096 / 2e9 * 1e3)
    assert asdict(placed)["special_ops"] == 1024 * 4096
