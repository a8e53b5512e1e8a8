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

The library policy (which aten ops a candidate may leave to torch, `--allow-torch` or
`[policy] allow_torch = [...]` in the nearest `htam.toml`) and the problem's scale
(`--scale`) belong to the task: the trusted side sets them, never a candidate.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from htam_engine.errors import UserError
from htam_engine.literals import int_literal
from htam_engine.parsing import parse, triton_source
from htam_engine.vocabulary import TORCH_OP_GROUPS, Backend, Kind, kind_of

DIRECTIVE_LINES = 10
_DIRECTIVE = re.compile(r"^\s*(?:#|//)\s*htam:\s*(?P<body>.*)$")
_REQUIRED = ("Model", "get_inputs", "get_init_inputs")
_OP_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
NO_OPS = ("none", "")
# Module-level integer sizes that `--scale` shrinks: the leading (batch-like) dimensions
# KernelBench problems keep as constants. Feature, channel and kernel sizes are kept:
# the model's weights depend on them.
SCALED_SIZES = ("batch_size", "batch", "N", "M", "B")


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
    kind: Kind
    entry: str | None
    backend: Backend
    # aten op names and groups (`gemm`, `conv`) a library may compute, see `allowed_ops`
    allow_torch: tuple[str, ...] = ()
    # `--scale`: the factor and each (size, as written, as run) it changed
    scale: float = 1.0
    scaled: tuple[tuple[str, int, int], ...] = ()


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
    if impl_source and triton_source.triton_functions(parse(impl_source, "python").root_node):
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


def is_reference(source: str) -> bool:
    """Whether `source` is a task by itself: it defines a KernelBench reference's names."""
    try:
        defined = _defined_names(source, Path("<source>"))
    except (TaskError, ValueError):  # not Python, or text no encoding holds (lone surrogates)
        return False
    return all(name in defined for name in _REQUIRED)


def _check_reference(path: Path, source: str) -> None:
    missing = [name for name in _REQUIRED if name not in _defined_names(source, path)]
    if missing:
        raise TaskError(f"{path} is not a KernelBench reference: missing {', '.join(missing)}")


def _nearest_toml(path: Path) -> tuple[Path, dict]:
    """The folder of the nearest `htam.toml` above `path` and its contents ({} if none)."""
    for folder in path.resolve().parents:
        config = folder / "htam.toml"
        if not config.is_file():
            continue
        try:
            return folder, tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise TaskError(f"{config}: {error}") from None
    return path.resolve().parent, {}


def toml_binding(impl: Path) -> dict[str, str]:
    """The `[[kernel]]` entry for `impl` in the nearest `htam.toml` above it, if any."""
    folder, data = _nearest_toml(impl)
    for entry in data.get("kernel", []):
        if isinstance(entry, dict) and (folder / str(entry.get("file", ""))) == impl.resolve():
            ref = folder / str(entry.get("reference", ""))
            return {"reference": str(ref), "entry": str(entry.get("entry", ""))}
    return {}


def parse_allow_torch(spec: str | list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """`"gemm, relu"` or `["gemm", "aten::relu"]` -> ("gemm", "relu"): aten op names and
    groups, in order, each once; `none` allows nothing."""
    parts = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise TaskError(f"{where}: {part!r} is not an op name")
        name = part.strip().removeprefix("aten::")
        if name.lower() in NO_OPS:
            continue
        if not _OP_NAME.match(name):
            groups = ", ".join(TORCH_OP_GROUPS)
            raise TaskError(f"{where}: {part!r} is not an aten op name or a group ({groups})")
        names.append(name)
    return tuple(dict.fromkeys(names))


def allowed_ops(allow_torch: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The aten op names a policy allows, its groups expanded."""
    ops: set[str] = set()
    for name in allow_torch:
        ops |= TORCH_OP_GROUPS.get(name, {name})
    return frozenset(ops)


def toml_policy(path: Path) -> tuple[str, ...]:
    """`[policy] allow_torch = [...]` of the nearest `htam.toml` above `path`."""
    _, data = _nearest_toml(path)
    policy = data.get("policy", {})
    if not isinstance(policy, dict) or "allow_torch" not in policy:
        return ()
    value = policy["allow_torch"]
    if not isinstance(value, list | str):
        raise TaskError("htam.toml: [policy] allow_torch must be a list of op names")
    return parse_allow_torch(value, "htam.toml [policy] allow_torch")


def with_policy(task: Task, allow_torch: str | None = None, scale: float | None = None) -> Task:
    """`task` under the command line's policy: `--allow-torch` replaces the htam.toml's
    (`--allow-torch none` allows nothing), `--scale F` shrinks the problem."""
    if allow_torch is not None:
        task = replace(task, allow_torch=parse_allow_torch(allow_torch, "--allow-torch"))
    if scale is not None and scale != 1.0:
        if not 0.0 < scale <= 1.0:
            raise TaskError(f"--scale {scale:g}: give a factor above 0 and at most 1")
        source, changed = scale_reference(task.reference_source, scale)
        if not changed:
            raise TaskError(
                f"--scale: {task.name} has no module-level size named "
                f"{', '.join(SCALED_SIZES)} to shrink"
            )
        task = replace(task, reference_source=source, scale=scale, scaled=changed)
    return task


def scale_reference(source: str, factor: float) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """The reference with each module-level `SIZE = <int>` of `SCALED_SIZES` multiplied
    by `factor` (at least 1), and what changed."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    changed: list[tuple[str, int, int]] = []
    for node in reversed(tree.body):  # bottom up: earlier lines keep their numbers
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        value = int_literal(node.value)
        if not isinstance(target, ast.Name) or target.id not in SCALED_SIZES or value is None:
            continue
        if node.lineno != node.end_lineno:
            continue
        new = max(1, int(value * factor))
        line = lines[node.lineno - 1]
        ending = "\n" if line.endswith("\n") else ""
        indent = line[: len(line) - len(line.lstrip())]
        lines[node.lineno - 1] = (
            f"{indent}{target.id} = {new}  # htam --scale {factor:g}: was {value}{ending}"
        )
        changed.append((target.id, value, new))
    return "".join(lines), tuple(reversed(changed))


def load_task(path: str | Path) -> Task:
    """Load the task that `path` (a reference, a bound `.py` or a bound `.cu`) belongs to."""
    impl = Path(path)
    source = _read(impl, "task file")
    kind = kind_of(impl)
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
        policy = toml_policy(impl)
        return Task(task_name(impl), impl, source, None, None, "py", None, "cpu", policy)
    reference = Path(binding["reference"])
    ref_source = _read(reference, "reference")
    _check_reference(reference, ref_source)
    entry = binding.get("entry") or None
    if kind == "cu" and not entry:
        raise TaskError(f"{impl}: a .cu binding needs entry=FUNCTION (the host function)")
    backend = guess_backend(kind, source)
    name = task_name(reference)
    return Task(name, reference, ref_source, impl, source, kind, entry, backend, toml_policy(impl))


def with_start(task: Task, start: Path) -> Task:
    """The task optimized from `start` instead: its backend follows the start's code."""
    source = _read(start, "start file")
    kind = kind_of(start)
    if kind != task.kind:
        raise TaskError(f"--start {start} is a .{kind} file but {task.name} is a .{task.kind} task")
    return replace(task, impl_source=source, backend=guess_backend(kind, source))


GENERIC_STEMS = {"reference", "ref", "model", "task", "problem"}


def task_name(reference: Path) -> str:
    """The operator's name: the reference's stem, or its folder's for generic stems."""
    stem = reference.stem
    return reference.resolve().parent.name if stem.lower() in GENERIC_STEMS else stem
