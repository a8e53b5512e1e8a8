"""Compile-check CUDA sources with `nvcc -cubin` where no GPU can run them.

`-cubin` runs nvcc's front end over the whole translation unit (host functions included:
a wrong call in a torch wrapper is an error there) and ptxas on the device code (too much
shared memory, too many registers), and skips the host compiler, which took 60 % of a
`-c` here (24 s against 60 s for the softmax example with the torch headers). What it
does not see: host code that only the host pass compiles (`#ifndef __CUDA_ARCH__`).

The check reads candidate-written text, so it runs as a worker does (`sandbox.run`): in
the sandbox of a scratch box, with the allowlisted environment, capped memory, files
and processes, killed with its caller; and its log keeps only what concerns the
candidate's own file (`excerpt.own_lines`): an `#include` of any other file cannot
bring that file's text into the verdict or the next prompt.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sysconfig
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from htam_engine.evaluate import excerpt, reaper, sandbox

ARCH = "sm_80"
SOURCE_NAME = "kernel.cu"
# Each of nvcc's processes may map up to MEMORY_MB (on the torch headers a kernel failed
# to compile at 3072 and compiled at 4096: cicc reserves far more than it touches), and
# all of them together hold at most RESIDENT_MB (cicc alone held 2.9 GB on a kernel that
# includes torch/extension.h): a source that includes /dev/zero is stopped there.
MEMORY_MB = 6144
RESIDENT_MB = 4096


# What `load_inline` puts before the CUDA sources it compiles (torch.utils.cpp_extension).
PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
MAX_DEPTH = 8  # a = b; b = c; ... resolved this deep


@dataclass(frozen=True)
class NvccResult:
    """How a compile check went: `compiled`, `rejected` (the log says why), `timeout`
    (nvcc ran over its limit: nothing is known about the code) or `absent` (no nvcc)."""

    status: str
    log: str = ""

    @property
    def compiled(self) -> bool:
        return self.status == "compiled"


def _assignments(body: ast.AST) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    """`name = ...` statements of a scope (a module or a function), by name, in order."""
    found: dict[str, list[ast.Assign | ast.AnnAssign]] = {}
    for node in ast.walk(body):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(node, ast.Assign | ast.AnnAssign):
                found.setdefault(target.id, []).append(node)
    return found


class _Resolver:
    """The string values an expression of a Python candidate stands for: literals, `+` of
    them, `textwrap.dedent(...)`, lists and tuples, and names assigned in the enclosing
    function or at module level (`cuda_sources=cuda_src` where `cuda_src = \"\"\"...\"\"\"`)."""

    def __init__(self, tree: ast.Module) -> None:
        self.module = {
            name: nodes
            for name, nodes in _assignments(tree).items()
            if any(node in tree.body for node in nodes)
        }
        self.scope_of: dict[int, ast.AST] = {}
        for function in ast.walk(tree):  # outer functions first: inner ones overwrite
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(function):
                    self.scope_of[id(node)] = function

    def values(self, node: ast.AST, at: ast.AST, depth: int = 0) -> list[str]:
        if depth > MAX_DEPTH:
            return []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.List | ast.Tuple):
            return [v for item in node.elts for v in self.values(item, at, depth + 1)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = (
                self.values(node.left, at, depth + 1),
                self.values(node.right, at, depth + 1),
            )
            return ["".join(left) + "".join(right)] if left and right else left or right
        if isinstance(node, ast.Call) and _name(node.func) == "dedent" and node.args:
            return [textwrap.dedent(v) for v in self.values(node.args[0], at, depth + 1)]
        if isinstance(node, ast.Name):
            value = self._assigned(node.id, at)
            return self.values(value, value, depth + 1) if value is not None else []
        return []

    def _assigned(self, name: str, at: ast.AST) -> ast.expr | None:
        """The value last assigned to `name` before `at`, in `at`'s function, else at
        module level."""
        line = getattr(at, "lineno", 0)
        scope = self.scope_of.get(id(at))
        for nodes in (
            _assignments(scope).get(name, []) if scope else [],
            self.module.get(name, []),
        ):
            before = [n for n in nodes if n.lineno <= line] or nodes
            if before and before[-1].value is not None:
                return before[-1].value
        return None


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def cuda_source(candidate: str, kind: str) -> str | None:
    """The CUDA code of a candidate as nvcc should see it: the `.cu` file itself, or
    what a Python candidate passes to `load_inline` as `cuda_sources` (literals or the
    variables holding them), with the includes `load_inline` adds; else any string
    literal holding a `__global__` kernel."""
    if kind == "cu":
        return candidate
    try:
        tree = ast.parse(candidate)
    except SyntaxError:
        return None
    resolver = _Resolver(tree)
    sources: list[str] = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _name(call.func) == "load_inline"):
            continue
        argument = next((k.value for k in call.keywords if k.arg == "cuda_sources"), None)
        if argument is None and len(call.args) > 2:
            argument = call.args[2]
        if argument is not None:
            sources += [v for v in resolver.values(argument, call) if v not in sources]
    if sources:
        return PRELUDE + "\n".join(sources)
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    return next((t for t in texts if isinstance(t, str) and "__global__" in t), None)


def _include_flags() -> list[str]:
    spec = importlib.util.find_spec("torch")
    flags = [f"-I{sysconfig.get_paths()['include']}"]
    if spec and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations))) / "include"
        flags += [f"-I{root}", f"-I{root / 'torch' / 'csrc' / 'api' / 'include'}"]
    return flags


def nvcc_check(
    source: str, timeout_s: float, memory_mb: int = MEMORY_MB, resident_mb: int = RESIDENT_MB
) -> NvccResult:
    """`nvcc -arch=sm_80 -cubin` on `source` with the torch headers reachable, sandboxed."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return NvccResult("absent", "nvcc not found on PATH")
    box = Path(tempfile.mkdtemp(prefix="htam-nvcc-"))
    try:
        (box / SOURCE_NAME).write_text(source)
        command = [nvcc, f"-arch={ARCH}", "-std=c++17", *_include_flags(), "-cubin", SOURCE_NAME]
        ran = sandbox.run(
            [*command, "-o", "kernel.cubin"],
            box,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            resident_mb=resident_mb,
        )
    finally:
        shutil.rmtree(box, ignore_errors=True)
    if ran.returncode is None:
        return NvccResult("timeout", f"nvcc ran over its limit of {timeout_s:g} s")
    if ran.returncode == reaper.OVER_MEMORY:
        return NvccResult("rejected", f"nvcc held over {resident_mb} MB (the cap): stopped")
    log = excerpt.own_lines(ran.output.replace(str(box / SOURCE_NAME), SOURCE_NAME), {SOURCE_NAME})
    return NvccResult("compiled" if ran.returncode == 0 else "rejected", log)
