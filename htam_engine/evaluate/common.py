"""Helpers shared by the worker and the judge processes (both import torch)."""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from htam_engine.evaluate.ops import LAYOUT_OPS, RANDOM_OPS
from htam_engine.kernels import CompileError
from htam_engine.vocabulary import PRECISION_FLOORS, TOLERANCES

_OOM = re.compile(
    r"out of memory|can't allocate memory|CUBLAS_STATUS_ALLOC_FAILED|std::bad_alloc", re.I
)
_CUDA = re.compile(r"CUDA error|CUDA kernel errors|cudaError|illegal memory access", re.I)
_ALIGN = 64
_ENTRY_SIGNATURE = r"((?:torch::Tensor|at::Tensor|std::vector<torch::Tensor>)\s+{name}\s*\([^)]*\))"


# aten ops that only allocate, view or copy, as the op recorder names them: anything else
# a candidate's forward runs is torch compute.
RECORDED_LAYOUT_OPS = (
    LAYOUT_OPS
    | RANDOM_OPS
    | {
        "new_empty_strided",
        "_unsafe_view",
        "_reshape_alias",
        "_to_copy",
        "select",
        "slice",
        "as_strided",
        "alias",
        "lift_fresh",
        "resize_",
        "set_",
        "split",
        "unbind",
        "empty_like",
        "is_nonzero",
        "item",
        "_local_scalar_dense",
        "from_file",  # the harness maps its buffers
        "flatten",
        "unflatten",
        "narrow",
        "view_as",
        "reshape_as",
        "expand_as",
        "resolve_conj",
        "resolve_neg",
    }
)
CANARY_OP = "frac"  # what the harness runs the judge's number of times before each call


def torch_compute(ops: dict[str, int], canaries: int) -> tuple[list[str], str]:
    """(the torch compute ops in a worker's raw record `ops`, why the record cannot be
    believed or ''): the judge's canaries must all be there; those beyond them are the
    candidate's own."""
    recorded = int(ops.get(CANARY_OP, 0))
    missing = (
        f"{canaries - recorded} of the judge's {canaries} canary ops are missing from the "
        "record (the op recorder was switched off or replaced)"
        if recorded < canaries
        else ""
    )
    compute = sorted(
        op
        for op, count in ops.items()
        if op not in RECORDED_LAYOUT_OPS
        and op + "_" not in RECORDED_LAYOUT_OPS
        and not (op == CANARY_OP and count <= canaries)
    )
    return compute, missing


class CandidateError(Exception):
    """The candidate file is not a usable implementation."""


def check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "passed": passed, "detail": "" if passed else detail}


def import_file(name: str, path: Path) -> ModuleType:
    """Import the file at `path` as module `name` (tracebacks name that file)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CandidateError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _guarded_targets() -> list[tuple[str, Any, str]]:
    targets = [
        ("time", time, "perf_counter"),
        ("time", time, "time"),
        ("time", time, "sleep"),
        ("torch", torch, "save"),
        ("torch", torch, "load"),
        ("torch", torch, "allclose"),
        ("torch", torch, "equal"),
        ("torch", torch, "isclose"),
        ("torch.testing", torch.testing, "assert_close"),
        ("torch.cuda", torch.cuda, "Event"),
        ("torch.cuda", torch.cuda, "synchronize"),
        ("torch.cuda.Event", torch.cuda.Event, "elapsed_time"),
        ("torch.Tensor", torch.Tensor, "__eq__"),
        ("torch.Tensor", torch.Tensor, "allclose"),
        ("torch.Tensor", torch.Tensor, "to"),
        ("torch.Tensor", torch.Tensor, "cpu"),
    ]
    return targets


def guarded_attributes() -> list[tuple[str, Any, str, Any]]:
    """Functions a candidate could replace to forge timing or comparison, captured now."""
    return [(label, owner, attr, getattr(owner, attr)) for label, owner, attr in _guarded_targets()]


def changed_attributes(guarded: list[tuple[str, Any, str, Any]]) -> list[str]:
    return [
        f"{label}.{attr}"
        for label, owner, attr, value in guarded
        if getattr(owner, attr) is not value
    ]


_EXTENSIONS = "torch.utils.cpp_extension"  # ~0.15 s to import (setuptools): only if used


def share_inline_builds(root: Path | None = None) -> None:
    """Make `load_inline` build into a folder of `root` keyed by the hash of its arguments.
    A worker gives its own box (a build shared between candidates could be poisoned);
    trusted tools share one under the HTAM home. Not imported yet, `cpp_extension` is
    patched when something imports it."""
    if root is None:
        from htam_engine.paths import subdir

        root = subdir("torch-extensions")
    if _EXTENSIONS in sys.modules:
        _key_builds(sys.modules[_EXTENSIONS], root)
    else:
        sys.meta_path.insert(0, _PatchOnImport(root))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `cpp_extension` as the next finders would, and patches it once loaded."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _EXTENSIONS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                load(module)
                _key_builds(module, self.root)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _key_builds(cpp_extension: Any, root: Path) -> None:
    original = cpp_extension.load_inline

    @functools.wraps(original)
    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("build_directory") is None:
            key = hashlib.sha256(
                repr((name, args, sorted(kwargs.items()), torch.__version__)).encode()
            ).hexdigest()[:20]
            folder = root / f"{name}-{key}"
            folder.mkdir(parents=True, exist_ok=True)
            kwargs["build_directory"] = str(folder)
        return original(name, *args, **kwargs)

    cpp_extension.load_inline = load_inline


def cuda_entry_model(source: str, entry: str, name: str) -> torch.nn.Module:
    """A module whose forward calls `entry` of a `.cu` file built with `load_inline`."""
    match = re.search(_ENTRY_SIGNATURE.format(name=re.escape(entry)), source)
    if match is None:
        raise CandidateError(f"no host function `torch::Tensor {entry}(...)` in the .cu file")
    ext_name = re.sub(r"\W", "_", f"htam_{name}_{entry}")
    import torch.utils.cpp_extension as cpp_extension

    module = cpp_extension.load_inline(
        ext_name, cpp_sources=match.group(1) + ";", cuda_sources=source, functions=[entry]
    )
    function = getattr(module, entry)

    class EntryModel(torch.nn.Module):
        def forward(self, *inputs: Any) -> Any:
            return function(*inputs)

    return EntryModel()


def classify(error: BaseException) -> tuple[str, str]:
    """(error kind, compiler log) for an exception raised by a candidate."""
    text = str(error)
    if isinstance(error, CompileError):
        return "compile_error", error.log
    if isinstance(error, SyntaxError):
        return "compile_error", ""
    if "Error building extension" in text:
        return "compile_error", text
    if isinstance(error, MemoryError | torch.cuda.OutOfMemoryError) or _OOM.search(text):
        return "oom", ""
    if _CUDA.search(text):
        return "cuda_error", ""
    return "runtime_error", ""


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A buffer twice the L2 size; zeroing it between trials evicts the inputs (GPU only)."""
    if device.type != "cuda":
        return None
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return torch.empty(max(2 * l2, 1 << 20) // 4, dtype=torch.float32, device=device)


def tolerance(dtype: torch.dtype) -> float:
    """atol = rtol for outputs of `dtype` (`vocabulary.TOLERANCES`)."""
    if not dtype.is_floating_point:
        return 0.0
    return TOLERANCES.get(str(dtype).removeprefix("torch."), TOLERANCES["float32"])


def precision_floor(dtype: torch.dtype) -> float | None:
    """`vocabulary.PRECISION_FLOORS` for `dtype` (None: not checked)."""
    return PRECISION_FLOORS.get(str(dtype).removeprefix("torch."))


def layout(values: list[Any]) -> tuple[list[dict[str, Any]], int]:
    """Where each tensor of `values` lies in a flat byte buffer (64-byte aligned), and
    the buffer's size; other values travel as they are."""
    items: list[dict[str, Any]] = []
    offset = 0
    for value in values:
        if not isinstance(value, torch.Tensor):
            items.append({"value": value})
            continue
        items.append({"dtype": str(value.dtype), "shape": list(value.shape), "offset": offset})
        offset += -(-value.numel() * value.element_size() // _ALIGN) * _ALIGN
    return items, offset


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CandidateError(f"unknown dtype {name!r}")
    return dtype


def write_item(descriptor: int, item: dict[str, Any], value: torch.Tensor) -> None:
    """Write `value` where `item` says in the file `descriptor` (no mapping is shared: a
    worker that truncates its buffer file cannot fault the writer)."""
    flat = value.detach().contiguous().reshape(-1).view(torch.uint8)
    data = flat.numpy().data
    written = 0
    while written < len(data):
        written += os.pwrite(descriptor, data[written:], item["offset"] + written)


def read_item(descriptor: int, item: dict[str, Any]) -> torch.Tensor | None:
    """The tensor `item` describes, read (copied) from the file `descriptor`; None when
    the file is shorter than the layout (a worker truncated it)."""
    dtype = _dtype(item["dtype"])
    count = 1
    for size in item["shape"]:
        count *= size
    raw = torch.empty(count * dtype.itemsize, dtype=torch.uint8)
    view = raw.numpy().data
    done = 0
    while done < len(view):
        got = os.preadv(descriptor, [view[done:]], item["offset"] + done)
        if got <= 0:
            return None
        done += got
    return raw.view(dtype).view(item["shape"])


def tensor_view(buffer: torch.Tensor, item: dict[str, Any]) -> torch.Tensor:
    """The tensor `item` describes, viewed in place in the byte `buffer`."""
    dtype = _dtype(item["dtype"])
    count = 1
    for size in item["shape"]:
        count *= size
    start = item["offset"]
    raw = buffer[start : start + count * dtype.itemsize]
    return raw.view(dtype).view(item["shape"])
