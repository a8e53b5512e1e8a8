"""Tasks in KernelBench's format and how an implementation names its reference.

A reference is a `.py` with `Model`, `get_inputs()` and `get_init_inputs()`. An
implementation is bound to it by, in order:

1. a directive comment on one of its first lines:
   `# htam: reference=reference.py` (Python, defines `ModelNew`) or
   `// htam: reference=ops/softmax_ref.py entry=softmax_forward` (CUDA, `entry` is the
   host function taking and returning torch tensors); paths are relative to the file;
2. an entry in the nearest `htam.toml` above the file:
   `[[kernel]] file="k.cu" reference="ref.py" entry="fn"` (paths relative to the toml);
3. a `.py` that itself holds `Model`: a task with no implementation yet.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from htam_engine import parsing
from htam_engine.errors import UserError
from htam_engine.vocabulary import Backend

DIRECTIVE_LINES = 10
_DIRECTIVE = re.compile(r"^\s*(?:#|//)\s*htam:\s*(?P<body>.*)$")
_REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class TaskError(UserError):
    """The task cannot be loaded: a missing, unbound or unparseable reference."""


@dataclass(frozen=True)
class Task:
    """A reference plus the implementation being optimized (None: not written yet)."""

    name: str
    reference_path: Path
    reference_source: str
    impl_path: Path | None
    impl_source: str | None
    kind: Literal["py", "cu"]
    entry: str | None
    backend: Backend


def parse_directive(source: str) -> dict[str, str]:
    """The `key=value` pairs of the first `htam:` directive in the first lines."""
    for line in source.splitlines()[:DIRECTIVE_LINES]:
        match = _DIRECTIVE.match(line)
        if match:
            pairs = (item.split("=", 1) for item in match["body"].split() if "=" in item)
            return {key: value.strip("\"'") for key, value in pairs}
    return {}


def guess_backend(kind: str, impl_source: str | None) -> Backend:
    """`cuda` for a `.cu`, `triton` for a `.py` with a `@triton.jit` kernel, `cuda` for a
    `load_inline(cuda_sources=...)` implementation, else `cpu`."""
    if kind == "cu":
        return "cuda"
    if impl_source and parsing.triton_functions(parsing.parse(impl_source, "python").root_node):
        return "triton"
    if impl_source and "load_inline" in impl_source and "cuda_sources" in impl_source:
        return "cuda"
    return "cpu"


def _read(path: Path, what: str) -> str:
    if not path.is_file():
        raise TaskError(f"{what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"cannot read {what} {path}: {error}") from None


def _defined_names(source: str, path: Path) -> set[str]:
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as error:
        raise TaskError(f"{path}:{error.lineno}: reference does not parse: {error.msg}") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _check_reference(path: Path, source: str) -> None:
    missing = [name for name in _REQUIRED if name not in _defined_names(source, path)]
    if missing:
        raise TaskError(f"{path} is not a KernelBench reference: missing {', '.join(missing)}")


def toml_binding(impl: Path) -> dict[str, str]:
    """The `[[kernel]]` entry for `impl` in the nearest `htam.toml` above it, if any."""
    for folder in impl.resolve().parents:
        config = folder / "htam.toml"
        if not config.is_file():
            continue
        try:
            data = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise TaskError(f"{config}: {error}") from None
        for entry in data.get("kernel", []):
            if isinstance(entry, dict) and (folder / str(entry.get("file", ""))) == impl.resolve():
                ref = folder / str(entry.get("reference", ""))
                return {"reference": str(ref), "entry": str(entry.get("entry", ""))}
        return {}
    return {}


def load_task(path: str | Path) -> Task:
    """Load the task that `path` (a reference, a bound `.py` or a bound `.cu`) belongs to."""
    impl = Path(path)
    source = _read(impl, "task file")
    kind: Literal["py", "cu"] = "cu" if impl.suffix in (".cu", ".cuh") else "py"
    binding = parse_directive(source)
    if binding.get("reference"):
        binding["reference"] = str(impl.parent / binding["reference"])
    else:
        binding = toml_binding(impl) or binding
    if not binding.get("reference"):
        if kind == "cu":
            raise TaskError(
                f"{impl} is not bound to a reference: add `// htam: reference=REF.py "
                "entry=FUNCTION` or an htam.toml [[kernel]] entry"
            )
        _check_reference(impl, source)
        return Task(task_name(impl), impl, source, None, None, "py", None, "cpu")
    reference = Path(binding["reference"])
    ref_source = _read(reference, "reference")
    _check_reference(reference, ref_source)
    entry = binding.get("entry") or None
    if kind == "cu" and not entry:
        raise TaskError(f"{impl}: a .cu binding needs entry=FUNCTION (the host function)")
    backend = guess_backend(kind, source)
    return Task(task_name(reference), reference, ref_source, impl, source, kind, entry, backend)


def with_start(task: Task, start: Path) -> Task:
    """The task optimized from `start` instead: its backend follows the start's code."""
    source = _read(start, "start file")
    kind: Literal["py", "cu"] = "cu" if start.suffix in (".cu", ".cuh") else "py"
    if kind != task.kind:
        raise TaskError(f"--start {start} is a .{kind} file but {task.name} is a .{task.kind} task")
    return replace(task, impl_source=source, backend=guess_backend(kind, source))


GENERIC_STEMS = {"reference", "ref", "model", "task", "problem"}


def task_name(reference: Path) -> str:
    """The operator's name: the reference's stem, or its folder's for generic stems."""
    stem = reference.stem
    return reference.resolve().parent.name if stem.lower() in GENERIC_STEMS else stem
