"""The judge: `python -m htam_engine.evaluate.judge JOBDIR`; the candidate never runs here.

It makes the input sets (fresh seeds), computes the reference outputs, then on `judge`
loads what the worker saved (plain tensors only, `weights_only=True`) and compares:
inputs unchanged, shape, dtype, NaN/Inf, aliasing, values, fresh (not another set's
answer) and synchronous (the answer was complete when forward returned).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from htam_engine.evaluate import common

Outputs = list[torch.Tensor]


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _prepare(jobdir: Path, job: dict[str, Any]) -> tuple[list[list[Any]], list[Outputs]]:
    reference = common.import_file("htam_reference", jobdir / "reference.py")
    device = torch.device(job["device"])
    torch.manual_seed(job["init_seed"])
    model = reference.Model(*reference.get_init_inputs()).to(device)
    all_inputs, all_outputs = [], []
    for index, seed in enumerate(job["seeds"]):
        torch.manual_seed(seed)
        alt = index == len(job["seeds"]) - 1 and hasattr(reference, "get_inputs_alt")
        inputs = list(reference.get_inputs_alt() if alt else reference.get_inputs())
        torch.save(inputs, jobdir / f"inputs_{index}.pt")
        moved = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            outputs = [o.detach().cpu() for o in _as_list(model(*moved))]
        all_inputs.append(inputs)
        all_outputs.append(outputs)
    return all_inputs, all_outputs


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and bool(
            torch.equal(a, b)
            or (torch.isnan(a) == torch.isnan(b)).all()
            and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        )
    )


def _close(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return False, "shape or dtype differs"
    tol = common.tolerance(ref.dtype)
    a, b = out.double(), ref.double()
    ok = torch.isclose(a, b, rtol=tol, atol=tol)
    if bool(ok.all()):
        return True, ""
    diff = (a - b).abs().nan_to_num(float("inf"))
    worst = int(diff.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape))
    return False, (
        f"{int((~ok).sum())}/{ok.numel()} values off by more than atol=rtol={tol:g}; "
        f"worst at {where}: got {a.flatten()[worst].item():.6g}, "
        f"expected {b.flatten()[worst].item():.6g}"
    )


class Judge:
    def __init__(self, inputs: list[list[Any]], expected: list[Outputs]) -> None:
        self.inputs = inputs
        self.expected = expected
        self.failures: dict[str, str] = {}

    def fail(self, name: str, index: int, detail: str) -> None:
        self.failures.setdefault(name, f"input set {index + 1}: {detail}")

    def judge_set(self, index: int, saved: dict[str, Any], late: dict[str, Any]) -> None:
        outputs, expected = _as_list(saved["outputs"]), self.expected[index]
        self._inputs_unchanged(index, saved["inputs"])
        if len(outputs) != len(expected):
            self.fail("output.shape", index, f"{len(outputs)} outputs, expected {len(expected)}")
            return
        tensors = [x for x in saved["inputs"] if isinstance(x, torch.Tensor)]
        for number, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
            if not isinstance(out, torch.Tensor):
                self.fail("output.type", index, f"output {number} is {type(out).__name__}")
                continue
            self._compare(index, out, ref, tensors)
            late_out = _as_list(late["outputs"])[number]
            if not _close(out, ref)[0] and _close(late_out, ref)[0]:
                self.fail(
                    "output.synchronous",
                    index,
                    "the result was completed after forward "
                    "returned (work on a side stream or thread)",
                )

    def _inputs_unchanged(self, index: int, after: list[Any]) -> None:
        for number, (before, now) in enumerate(zip(self.inputs[index], after, strict=False)):
            if isinstance(before, torch.Tensor) and not _same(before, now.cpu()):
                self.fail("output.inputs_unchanged", index, f"input {number} was modified")

    def _compare(self, index: int, out: torch.Tensor, ref: torch.Tensor, inputs: Outputs) -> None:
        if out.shape != ref.shape:
            self.fail(
                "output.shape", index, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
            )
            return
        if out.dtype != ref.dtype:
            self.fail("output.dtype", index, f"dtype {out.dtype}, expected {ref.dtype}")
            return
        pointer = out.untyped_storage().data_ptr()
        if any(x.untyped_storage().data_ptr() == pointer for x in inputs):
            self.fail("output.aliasing", index, "the output shares memory with an input")
        if out.is_floating_point() and not bool(torch.isfinite(out).all()):
            bad = int((~torch.isfinite(out)).sum())
            self.fail(
                "output.finite",
                index,
                f"{bad} NaN/Inf values (fresh allocations are "
                "NaN-filled: stale or unwritten memory?)",
            )
            return
        ok, detail = _close(out, ref)
        if ok:
            return
        stale = [
            j
            for j, other in enumerate(self.expected)
            if j != index and other[0].shape == out.shape and _close(out, other[0])[0]
        ]
        if stale:
            self.fail(
                "output.fresh",
                index,
                f"returned the answer for input set {stale[0] + 1} (outputs cached across calls)",
            )
        self.fail("output.values", index, detail)

    def checks(self) -> list[dict[str, Any]]:
        names = (
            "inputs_unchanged",
            "type",
            "shape",
            "dtype",
            "aliasing",
            "finite",
            "fresh",
            "synchronous",
            "values",
        )
        return [
            common.check(
                f"output.{n}",
                f"output.{n}" not in self.failures,
                self.failures.get(f"output.{n}", ""),
            )
            for n in names
        ]


def main(jobdir: Path) -> None:
    job = json.loads((jobdir / "job.json").read_text())
    inputs, expected = _prepare(jobdir, job)
    print(json.dumps({"event": "prepared"}), flush=True)
    if sys.stdin.readline().strip() != "judge":
        return
    judge = Judge(inputs, expected)
    for index in range(len(inputs)):
        try:
            saved = torch.load(jobdir / f"cand_{index}.pt", map_location="cpu", weights_only=True)
            late = torch.load(jobdir / f"late_{index}.pt", map_location="cpu", weights_only=True)
        except Exception as error:  # a forged or subclassed file is a failed check, not a crash
            judge.fail("output.type", index, f"unreadable output file: {error}"[:300])
            continue
        judge.judge_set(index, saved, late)
    print(
        json.dumps({"event": "judged", "checks": judge.checks(), "sets": len(inputs)}), flush=True
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
