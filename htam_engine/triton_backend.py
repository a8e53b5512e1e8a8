"""What evaluating a Triton candidate needs beyond a CUDA one.

On a machine without a CUDA device a Triton candidate runs under Triton's interpreter
(`TRITON_INTERPRET=1`, numpy on the CPU): it is verified like any candidate and never
timed, because interpreter times say nothing about the kernel. On a CUDA device it is
compiled and timed like CUDA. Nothing here imports triton until a worker asks for it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import text, triton_source

INSTALL_HINT = "install htam-lsp[triton]"
MIN_VERSION = (3, 2)  # the `triton>=3.2` of the extra
NOT_TIMED = "not timed: Triton interpreter"
CORRECTNESS_ONLY = (
    "correctness only: Triton kernels run under Triton's interpreter on a CPU and are not "
    "timed, so this run learns which strategies give correct code, not which are faster"
)


def missing() -> str | None:
    """None when a usable Triton is installed here, else what is wrong and the fix."""
    if importlib.util.find_spec("triton") is None:
        return f"Triton is not installed: {INSTALL_HINT} (pip install 'htam-lsp[triton]')"
    version = importlib.metadata.version("triton")
    if _release(version) < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        return f"Triton {version} is too old (need >= {wanted}): {INSTALL_HINT}"
    return None


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "3.9.0" or "3.2.0+git1a2b"."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def interpreted(device: str) -> bool:
    """Triton runs compiled only on a CUDA device; anywhere else under the interpreter."""
    return device != "cuda"


def environment(device: str, scratch: Path) -> dict[str, str]:
    """Variables a Triton candidate's process needs: its caches inside the sandbox's one
    writable folder (there is no home directory), and the interpreter off a GPU."""
    env = {"TRITON_HOME": str(scratch), "TRITON_CACHE_DIR": str(scratch / "triton")}
    if interpreted(device):
        env["TRITON_INTERPRET"] = "1"
    return env


def timing_note(backend: str, device: str) -> str | None:
    """Why a candidate is not timed (the verdict's note), or None when it is timed."""
    return NOT_TIMED if backend == "triton" and interpreted(device) else None


def unlaunched(source: str) -> str | None:
    """Why a Triton candidate is not a custom kernel (no `@triton.jit` kernel launched from
    a function), or None. Torch doing the work is static.torch_compute's to catch."""
    units = [u for u in parsing.kernels(source, "python") if u.kind == "triton"]
    if not units:
        return "no @triton.jit kernel in the candidate"
    if not any(u.launchers for u in units):
        names = ", ".join(u.name for u in units)
        return f"the @triton.jit kernels ({names}) are never launched (kernel[grid](...))"
    return None


# Builtins a kernel or a grid function may call: the Triton compiler accepts them.
BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "bool", "abs", "print"})


def foreign_calls(source: str) -> str:
    """Calls in `@triton.jit` bodies and grid functions to anything but Triton, the
    file's other kernels, a few builtins and methods of local values ('' when none).
    The GPU compiler rejects such calls; the interpreter runs them as Python, so numpy
    or torch there would do the work unseen (`prepare_interpreter` lifts the probes)."""
    root = parsing.parse(source, "python").root_node
    kernels = triton_source.kernels(root)
    callable_ = _triton_names(root) | {k.name for k in kernels} | BUILTINS
    scopes = [k.decorated for k in kernels]
    scopes += [triton_source.grid_code(launch) for k in kernels for launch in k.launches]
    hits = [hit for scope in scopes for hit in _foreign(scope, callable_, _locals(scope))]
    return "; ".join(dict.fromkeys(hits))


def _triton_names(root: Node) -> set[str]:
    """Names the file binds to Triton modules (`import triton.language as tl`, `from
    triton.language.extra import libdevice`)."""
    names = {"tl", "triton"}
    for stmt in root.children:
        module = stmt.child_by_field_name("module_name")
        if stmt.type == "import_from_statement" and text(module).startswith("triton"):
            names |= {text(n).split(" as ")[-1] for n in stmt.named_children[1:]}
        elif stmt.type == "import_statement" and "triton" in text(stmt):
            names |= {text(n).split(" as ")[-1].split(".")[0] for n in stmt.named_children}
    return names


BINDERS: tuple[str, ...] = (
    "parameters",
    "lambda_parameters",
    "typed_parameter",
    "default_parameter",
)
BINDERS += ("typed_default_parameter", "pattern_list", "assignment", "for_statement")


def _locals(scope: Node) -> set[str]:
    """Names bound in `scope` (and, for a grid, in the function around it): parameters,
    assignment targets, loop variables. Their methods are tensor methods."""
    around = scope.parent
    while around is not None and around.type != "function_definition":
        around = around.parent
    scopes = (scope,) if around is None else (scope, around)
    return {
        text(n)
        for node in scopes
        for n in parsing.walk(node)
        if n.type == "identifier"
        and n.parent is not None
        and n.parent.type in BINDERS
        and n not in (n.parent.child_by_field_name("right"), n.parent.child_by_field_name("type"))
    }


def _foreign(scope: Node, callable_: set[str], local: set[str]) -> list[str]:
    """Calls of anything but `callable_` names, or of methods of `callable_` or `local`
    names or of computed values (whose own calls are looked at too)."""
    hits = []
    for call in parsing.walk(scope):
        callee = call.child_by_field_name("function") if call.type == "call" else None
        if callee is None:
            continue
        head = _head(callee)
        allowed = callable_ | (local if callee.type == "attribute" else set())
        if head is not None and head not in allowed:
            hits.append(f"line {call.start_point[0] + 1}: {text(callee)}")
    return hits


def _head(callee: Node) -> str | None:
    """The name a callee starts from (`np` of `np.linalg.norm`, `x` of `x[0].to`), or
    None for a method of a computed value such as `(a < b).to`."""
    node: Node | None = callee
    fields = {"attribute": "object", "subscript": "value", "call": "function"}
    while node is not None and node.type in fields:
        node = node.child_by_field_name(fields[node.type])
    return text(node) if node is not None and node.type == "identifier" else None


Benchmark = Callable[..., list[float]]


def first_config(
    kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5,)
) -> list[float]:
    """An autotuning "benchmark" for the interpreter: the same time for every config
    without running it, so the first config is kept and the candidate runs once per
    call. Interpreter times would pick a config at random, and running every config
    multiplies the verification time by the config count."""
    return [0.0 for _ in quantiles]


def prepare_interpreter(
    benchmark: Benchmark = first_config,
    unwatched: Callable[[], AbstractContextManager[Any]] | None = None,
) -> None:
    """Call in the candidate's process, with TRITON_INTERPRET=1 set and before the
    candidate is imported: `@triton.autotune` otherwise asks for a GPU driver to time its
    configs and every autotuned candidate crashes on a CPU. On a CPU the first config is
    the one verified; on a GPU every config is timed and the chosen one verified.

    `unwatched` is a context each interpreted launch runs in: the worker pauses its
    library probe there, since numpy is how the interpreter computes (and a profile hook
    makes it several times slower); `foreign_calls` keeps other calls out of kernels."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import GridExecutor

    Autotuner.do_bench = staticmethod(benchmark)  # type: ignore[assignment]
    if unwatched is None:
        return
    launch = GridExecutor.__call__

    def quiet(self: GridExecutor, *args: Any, **kwargs: Any) -> Any:
        with unwatched():
            return launch(self, *args, **kwargs)

    GridExecutor.__call__ = quiet  # type: ignore[method-assign]
