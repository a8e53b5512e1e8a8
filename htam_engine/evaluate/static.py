"""Static anti-cheat checks, run in the caller before a candidate is ever executed.

`kernelguard` (PyPI) supplies its rule set for GPU-kernel reward hacks; the checks
below add the hacks KernelBench's static checker lists that kernelguard does not flag
in this form (torch compute in `forward`, try/except bypass, monkey-patching, frame
inspection, side threads and streams, tensor subclasses, silent downcasts).

Every check reads tokens, never raw text, so identifiers, strings and comments never
trigger (`long half = n / 2;`, a docstring about threading). Python is read through its
`ast`, with module aliases expanded (`import threading as t`, `__import__("thread" +
"ing")`, `getattr(sys, "_getframe")`). C++/CUDA is read with tree-sitter, comments and
string literals skipped and `#define` bodies read as code: a `.cu` file, or the string
literals of a `.py` file that hold C++ (what `load_inline` / `load_cpp` compile).
kernelguard's regular expressions see the code without comments and docstrings, and
one of its findings counts only if it stays when the candidate's own names are renamed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine import triton_backend
from htam_engine.evaluate.ops import LAYOUT_OPS, RANDOM_OPS
from htam_engine.evaluate.verdict import Check
from htam_engine.parsing import embedded_sources, parse, text, walk

# Python-API names that are no computation either.
ALLOWED_TORCH = (
    LAYOUT_OPS
    | RANDOM_OPS
    | {
        "tensor",
        "as_tensor",
        "from_numpy",
        "device",
        "dtype",
        "Size",
        "broadcast_shapes",
        "manual_seed",
        "no_grad",
        "inference_mode",
        "flatten",
        "size",
        "stride",
        "numel",
        "dim",
        "data_ptr",
        "is_contiguous",
        "cpu",
        "cuda",
        "float",
        "double",
        "item",
        "tolist",
        "get_device",
        "current_stream",
        "current_device",
        "synchronize",
        "is_available",
    }
)
_TORCH_ROOTS = frozenset({"torch", "F", "nn", "functional"})
_PATCHED_ROOTS = frozenset({"time", "torch", "builtins", "sys", "gc", "inspect", "numpy"})

# --- what each check looks for, as tokens ----------------------------------------------
# frame inspection: attributes only frames and the interpreter have, or (module, name)
_FRAME_ATTRS = frozenset(
    {"_getframe", "_current_frames", "currentframe", "f_back", "f_locals", "f_globals"}
    | {"tb_frame", "gi_frame", "cr_frame", "get_referrers"}
)
_FRAME_CALLS = {
    "inspect": {"stack", "trace", "getouterframes", "getinnerframes", "getframeinfo"},
    "gc": {"get_objects", "get_referrers"},
    "sys": {"settrace", "setprofile"},
    "traceback": {"extract_stack", "walk_stack", "format_stack", "print_stack"},
}
# work off the caller's path: threads, streams, other processes; in Python and in C++
_ASYNC_MODULES = frozenset(
    {"threading", "_thread", "concurrent", "multiprocessing", "asyncio", "subprocess", "pty"}
)
_ASYNC_ATTRS = {
    "torch": frozenset({"Stream", "stream", "ExternalStream", "fork"}),
    "os": frozenset({"fork", "forkpty", "system", "popen", "setsid", "daemon"}),
}
_PROCESS_PREFIXES = ("spawn", "exec", "posix_spawn")  # os.spawnv, os.execve, ...
_CPP_ASYNC_TYPES = frozenset({"std::thread", "std::jthread", "thread", "jthread"})
_CPP_ASYNC_CALLS = frozenset(
    {"async", "pthread_create", "getStreamFromPool", "at::launch", "torch::jit::fork"}
    | {"cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority"}
    | {"fork", "vfork", "system", "popen", "posix_spawn", "posix_spawnp", "setsid", "daemon"}
    | {"execl", "execle", "execlp", "execv", "execve", "execvp", "execvpe"}
)
# half precision: torch/numpy dtypes, tensor methods, C++ types, intrinsics
_LOW_DTYPES = frozenset(
    {"float16", "bfloat16", "Half", "BFloat16", "autocast", "float8_e4m3fn", "float8_e5m2"}
)
_LOW_METHODS = frozenset({"half", "bfloat16"})
_CPP_LOW_TYPES = frozenset(
    {"half", "half2", "__half", "__half2", "_Float16", "__fp16", "__bf16"}
    | {"__nv_bfloat16", "__nv_bfloat162", "nv_bfloat16", "nv_bfloat162"}
)
_CPP_LOW_NAMES = frozenset({"Half", "BFloat16", "kHalf", "kFloat16", "kBFloat16"})
_CPP_LOW_CALL = re.compile(
    r"(__float2half|__floats2half2|__float22half2|__float2bfloat16|__floats2bfloat162"
    r"|__half2float|__bfloat162float|__h[a-z]\w*|h2?exp2?|h2?sqrt|h2?rsqrt|half|half2)$"
)
_IMPORTERS = frozenset({"import_module", "importlib.import_module"})
_EXECUTORS = frozenset({"exec", "eval", "compile"})  # builtins that run a string as code
_BUILTINS = frozenset({"builtins", "__builtins__"})
MAX_NESTING = 4  # exec("exec('...')") is read this deep
_CPP_MARKERS = ("#include", "#define", "__global__", "__device__", 'extern "C"')
_CPP_SKIPPED = frozenset(
    {"comment", "string_literal", "raw_string_literal", "char_literal", "system_lib_string"}
    | {"concatenated_string"}
)


def _attr_chain(node: ast.AST) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def _forward_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node inside `ModelNew`'s methods."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            yield from ast.walk(node)


def _compute_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node in `ModelNew`'s methods but `__init__`, where building parameters with
    torch modules (as the reference does, for identical weights) is no computation."""
    for node in _forward_nodes(tree):
        if isinstance(node, ast.FunctionDef) and node.name != "__init__":
            yield from ast.walk(node)


def _torch_compute(tree: ast.Module, allowed: frozenset[str]) -> str:
    """torch calls in forward that compute, but those the policy allows (`torch.mm`,
    `F.conv2d`: their Python names are their aten names)."""
    calls = []
    for node in _compute_nodes(tree):
        if isinstance(node, ast.Call):
            chain = _attr_chain(node.func)
            free = chain[-1:] and (chain[-1] in ALLOWED_TORCH or chain[-1] in allowed)
            if len(chain) >= 2 and chain[0] in _TORCH_ROOTS and not free:
                calls.append(f"line {node.lineno}: {'.'.join(chain)}")
    return "; ".join(calls)


def _reference_fallback(tree: ast.Module) -> str:
    hits = [
        f"line {node.lineno}: uses the reference `Model`"
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == "Model"
    ]
    return "; ".join(hits)


def _try_except(tree: ast.Module) -> str:
    lines = [str(n.lineno) for n in _forward_nodes(tree) if isinstance(n, ast.Try)]
    return f"try/except in ModelNew at line {', '.join(lines)}" if lines else ""


def _tensor_subclass(tree: ast.Module) -> str:
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [".".join(_attr_chain(base)) for base in node.bases]
            if any(base.endswith("Tensor") for base in bases):
                hits.append(f"line {node.lineno}: class {node.name} subclasses Tensor")
        if isinstance(node, ast.FunctionDef) and node.name in (
            "__torch_function__",
            "__torch_dispatch__",
        ):
            hits.append(f"line {node.lineno}: defines {node.name}")
    return "; ".join(hits)


# --- Python, read as tokens --------------------------------------------------------------


@dataclass(frozen=True)
class _Use:
    """One name the code refers to, module aliases expanded ("?" roots a local value)."""

    line: int
    chain: tuple[str, ...]
    called: bool


def _folded(node: ast.AST) -> str | None:
    """The value of a string constant, or of a `+` of them (`"thread" + "ing"`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _builtin(func: ast.AST) -> str:
    """The builtin a call's function names: `exec`, `builtins.exec`, `getattr(builtins,
    "exec")`, `__builtins__.__import__`; "" for anything else."""
    if isinstance(func, ast.Name):
        return func.id
    chain = _attr_chain(func)
    if len(chain) == 2 and chain[0] in _BUILTINS:
        return chain[1]
    if not isinstance(func, ast.Call) or _attr_chain(func.func) != ["getattr"]:
        return ""
    on_builtins = len(func.args) > 1 and _attr_chain(func.args[0])[:1] in (
        ["builtins"],
        ["__builtins__"],
    )
    return (_folded(func.args[1]) or "") if on_builtins else ""


def _imported(node: ast.AST) -> str | None:
    """The module that a `__import__("m")` or `importlib.import_module("m")` call loads."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    if _builtin(node.func) == "__import__" or ".".join(_attr_chain(node.func)) in _IMPORTERS:
        return _folded(node.args[0])
    return None


def _executed_calls(tree: ast.AST, shadowed: set[str]) -> Iterator[ast.Call]:
    """Calls of the builtins that run strings (not of the candidate's own `compile`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name = _builtin(node.func)
            if name in _EXECUTORS and not (isinstance(node.func, ast.Name) and name in shadowed):
                yield node


def _executed(tree: ast.Module, shadowed: set[str]) -> list[ast.Module]:
    """The code that `exec` / `eval` / `compile` calls run from string constants, parsed
    at the call's line (nested ones too, MAX_NESTING deep)."""
    found: list[ast.Module] = []
    pending = [tree]
    for _ in range(MAX_NESTING):
        parsed = []
        for call in (c for module in pending for c in _executed_calls(module, shadowed)):
            code = _folded(call.args[0])
            try:
                module = ast.parse(code) if code is not None else None
            except SyntaxError:
                continue
            if module is not None:
                parsed.append(ast.increment_lineno(module, call.lineno - 1))
        found += parsed
        pending = parsed
    return found


def _dynamic_code(view: _PyView) -> str:
    """`exec` / `eval` / `compile` of a string built at run time: code no check can read."""
    return _hits(
        (call.lineno, f"{_builtin(call.func)}(<computed at run time>)")
        for tree in view.trees
        for call in _executed_calls(tree, view.shadowed)
        if _folded(call.args[0]) is None
    )


def _imports(trees: list[ast.Module]) -> Iterator[tuple[int, str, str]]:
    """(line, bound name, dotted module or object) for every import the code makes."""
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                yield node.lineno, bound, alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                yield node.lineno, alias.asname or alias.name, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Assign) and (module := _imported(node.value)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield node.lineno, target.id, module


class _PyView:
    """A parsed Python candidate: its module aliases and every name it refers to."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.shadowed = _own_names(tree)
        self.trees = [tree, *_executed(tree, self.shadowed)]  # the file, and what it execs
        self.aliases = {bound: dotted for _, bound, dotted in _imports(self.trees)}
        called = {id(node.func) for node in self.walk() if isinstance(node, ast.Call)}
        self.uses = [
            _Use(getattr(node, "lineno", 0), tuple(chain), id(node) in called)
            for node in self.walk()
            if not isinstance(getattr(node, "ctx", None), ast.Store)
            and (chain := self.resolve(node))
            and chain != ["?"]
        ]

    def walk(self) -> Iterator[ast.AST]:
        for tree in self.trees:
            yield from ast.walk(tree)

    def resolve(self, node: ast.AST) -> list[str]:
        """The dotted name an expression refers to: `np.float16` -> numpy.float16,
        `getattr(sys, "_getframe")` -> sys._getframe, `__import__("time").sleep` ->
        time.sleep; a name the code did not import is "?"; [] for other expressions."""
        if isinstance(node, ast.Attribute):
            return [*(self.resolve(node.value) or ["?"]), node.attr]
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, "?").split(".")
        if (module := _imported(node)) is not None:
            return module.split(".")
        if isinstance(node, ast.Call) and _attr_chain(node.func) == ["getattr"]:
            name = _folded(node.args[1]) if len(node.args) > 1 else None
            if name is not None:
                return [*(self.resolve(node.args[0]) or ["?"]), name]
        return []

    def imported_modules(self) -> Iterator[tuple[int, str]]:
        yield from ((line, dotted) for line, _, dotted in _imports(self.trees))
        for node in self.walk():
            if (module := _imported(node)) is not None:
                yield getattr(node, "lineno", 0), module


def _hits(found: Iterable[tuple[int, str]]) -> str:
    return "; ".join(dict.fromkeys(f"line {line}: {token}" for line, token in found))


def _py_frames(view: _PyView) -> Iterator[tuple[int, str]]:
    for use in view.uses:
        root, last = use.chain[0], use.chain[-1]
        if len(use.chain) > 1 and (last in _FRAME_ATTRS or last in _FRAME_CALLS.get(root, ())):
            yield use.line, ".".join(use.chain)


def _py_async(view: _PyView) -> Iterator[tuple[int, str]]:
    for line, module in view.imported_modules():
        if _ASYNC_MODULES.intersection(module.split(".")):
            yield line, f"imports {module}"
    for use in view.uses:
        root, last = use.chain[0], use.chain[-1]
        spawns = root == "os" and last.startswith(_PROCESS_PREFIXES)
        if len(use.chain) > 1 and (last in _ASYNC_ATTRS.get(root, ()) or spawns):
            yield use.line, ".".join(use.chain)


def _py_low_precision(view: _PyView) -> Iterator[tuple[int, str]]:
    for use in view.uses:
        root, last = use.chain[0], use.chain[-1]
        half_method = last in _LOW_METHODS and (use.called or root in ("torch", "numpy"))
        if len(use.chain) > 1 and (last in _LOW_DTYPES or half_method):
            yield use.line, ".".join(use.chain)


def _docstrings(tree: ast.Module) -> set[int]:
    """Ids of string constants that stand alone as statements (docstrings, notes)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _looks_like_cpp(value: str) -> bool:
    return ("{" in value and ";" in value) or any(marker in value for marker in _CPP_MARKERS)


def _cpp_strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(first line, text) of each string literal (or `+` of literals) holding C++."""
    skipped = _docstrings(tree)
    for node in ast.walk(tree):  # breadth first: a `+` is seen before its operands
        if id(node) in skipped:
            skipped.update(id(child) for child in ast.iter_child_nodes(node))
            continue
        value = _folded(node)
        if value is None:
            continue
        skipped.update(id(child) for child in ast.iter_child_nodes(node))
        if _looks_like_cpp(value):
            yield getattr(node, "lineno", 1), value


# --- C++ / CUDA, read as tokens ------------------------------------------------------------


@dataclass(frozen=True)
class _CppToken:
    line: int
    kind: str  # "type" | "qualified" | "call"
    text: str

    @property
    def last(self) -> str:
        """The unqualified name: `std::async` -> async, `x.half` -> half."""
        return re.split(r"::|\.|->", self.text)[-1]


def _cpp_kind(node: Node) -> str | None:
    if node.type in ("type_identifier", "primitive_type"):
        return "type"
    if node.type == "qualified_identifier":
        return "qualified"
    return "call" if node.type == "call_expression" else None


def _cpp_tokens(code: str, first_line: int) -> Iterator[_CppToken]:
    """Types, qualified names and called functions of C++ code, outside comments and
    literals; a `#define`'s body is read as code, a `#pragma`'s is not."""
    stack = [parse(code, "cuda").root_node]
    while stack:
        node = stack.pop()
        if node.type in _CPP_SKIPPED:
            continue
        line = first_line + node.start_point[0]
        if node.type == "preproc_arg":
            if node.parent is not None and node.parent.type != "preproc_call":
                yield from _cpp_tokens(text(node), line)
            continue
        if (kind := _cpp_kind(node)) is not None:
            target = node.child_by_field_name("function") if kind == "call" else node
            yield _CppToken(line, kind, re.sub(r"\s+", "", text(target)))
        stack.extend(node.children)


def _cpp_async(token: _CppToken) -> bool:
    if token.kind == "call":
        return token.last in _CPP_ASYNC_CALLS or token.text in _CPP_ASYNC_CALLS
    return token.text in _CPP_ASYNC_TYPES


def _cpp_low_precision(token: _CppToken) -> bool:
    if token.kind == "call":
        return _CPP_LOW_CALL.match(token.last) is not None
    if token.kind == "qualified":
        return token.last in _CPP_LOW_NAMES
    return token.text in _CPP_LOW_TYPES


@dataclass
class _Code:
    """What a candidate's checks read: its Python view (a `.py` that parses) and the
    tokens of its C++ (the `.cu` file, or the C++ string literals of the `.py`)."""

    python: _PyView | None
    cpp: list[_CppToken]

    @classmethod
    def read(cls, source: str, kind: str) -> _Code:
        if kind != "py":
            return cls(None, list(_cpp_tokens(source, 1)))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return cls(None, [])  # reported as a compile error by the worker, with its line
        tokens = [tok for line, code in _cpp_strings(tree) for tok in _cpp_tokens(code, line)]
        return cls(_PyView(tree), tokens)

    def find(
        self,
        python: Callable[[_PyView], Iterator[tuple[int, str]]],
        cpp: Callable[[_CppToken], bool],
    ) -> str:
        found = list(python(self.python)) if self.python is not None else []
        found += [(token.line, token.text) for token in self.cpp if cpp(token)]
        return _hits(sorted(found))


def _never(_token: _CppToken) -> bool:
    return False


# --- monkey-patching ------------------------------------------------------------------------


def _namespace_of(node: ast.AST) -> ast.AST | None:
    """`X` of `vars(X)` or of `X.__dict__`: writing into it rebinds X's attributes."""
    if isinstance(node, ast.Call) and _attr_chain(node.func) == ["vars"] and node.args:
        return node.args[0]
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return node.value
    return None


def _assigned(view: _PyView, target: ast.AST) -> list[str]:
    if isinstance(target, ast.Attribute):
        return view.resolve(target)
    if isinstance(target, ast.Subscript) and (owner := _namespace_of(target.value)) is not None:
        return [*view.resolve(owner), "[...]"]
    return []


def _patched_targets(view: _PyView, node: ast.AST) -> list[list[str]]:
    """What `node` rebinds: `a.b = ...`, `setattr(a, ...)`, `vars(a)[...] = ...`,
    `a.__dict__[...] = ...`, `vars(a).update(...)`."""
    if isinstance(node, ast.Assign):
        return [_assigned(view, target) for target in node.targets]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [_assigned(view, node.target)]
    if not isinstance(node, ast.Call):
        return []
    if _attr_chain(node.func) in (["setattr"], ["delattr"]) and node.args:
        return [view.resolve(node.args[0])]
    method = node.func
    if isinstance(method, ast.Attribute) and method.attr in ("update", "setdefault", "__setitem__"):
        owner = _namespace_of(method.value)
        return [view.resolve(owner)] if owner is not None else []
    return []


def _aten_override(view: _PyView) -> str:
    """torch.library registrations into the `aten` namespace: a kernel of the candidate's
    under a library op's name (what `--allow-torch` allows would not be the library)."""
    found = []
    for node in view.walk():
        if not isinstance(node, ast.Call):
            continue
        chain = view.resolve(node.func)
        if chain[:2] != ["torch", "library"]:
            continue
        names = [_folded(arg) for arg in [*node.args, *(k.value for k in node.keywords)]]
        if any(n is not None and (n == "aten" or n.startswith("aten::")) for n in names):
            found.append((node.lineno, f"{'.'.join(chain)}(aten ...)"))
    return _hits(found)


def _monkeypatch(view: _PyView) -> str:
    return _hits(
        (getattr(node, "lineno", 0), f"patches {'.'.join(chain)}")
        for node in view.walk()
        for chain in _patched_targets(view, node)
        if chain and chain[0] in _PATCHED_ROOTS
    )


# --- kernelguard, on code without comments and docstrings -----------------------------------


def _blank(data: bytearray, start: int, end: int, keep: bytes = b"") -> None:
    """Overwrite data[start:end] with `keep` then spaces, newlines kept (lines stay put)."""
    for offset in range(start, end):
        if data[offset] != ord("\n"):
            data[offset] = ord(" ")
    data[start : start + len(keep)] = keep


def _cpp_comments(code: bytes) -> Iterator[tuple[int, int]]:
    for node in walk(parse(code, "cuda").root_node):
        if node.type == "comment":
            yield node.start_byte, node.end_byte


def _without_comments(source: str, kind: str) -> str:
    """The code kernelguard reads: comments blanked (Python's, and C++'s in the embedded
    sources), docstrings emptied; lines and columns unchanged."""
    data = bytearray(source.encode())
    if kind != "py":
        for start, end in _cpp_comments(bytes(data)):
            _blank(data, start, end)
        return data.decode(errors="replace")
    for item in embedded_sources(bytes(data)):
        for start, end in _cpp_comments(bytes(data[item.start_byte : item.end_byte])):
            _blank(data, item.start_byte + start, item.start_byte + end)
    for node in walk(parse(bytes(data), "python").root_node):
        if node.type == "comment":
            _blank(data, node.start_byte, node.end_byte)
        elif node.type == "expression_statement" and [c.type for c in node.children] == ["string"]:
            _blank(data, node.start_byte, node.end_byte, b'""')
    return data.decode(errors="replace")


def _own_names(tree: ast.Module) -> set[str]:
    """Names the candidate itself defines: functions, classes, arguments, variables and
    its objects' attributes (`self.x`); never an attribute it sets on a module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and _attr_chain(node)[:1] == ["self"]:
            names.add(node.attr)
    return names - {"self", "forward", "ModelNew", "__init__"}


def _renamed(code: str) -> str:
    """`code` with every name the candidate defines replaced by a neutral one, where it
    stands alone or after `self.` (an attribute of anything else keeps its name)."""
    try:
        own = sorted(_own_names(ast.parse(code)))
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (SyntaxError, tokenize.TokenError):
        return code
    neutral = {name: f"name_{index}" for index, name in enumerate(own)}
    lines = code.splitlines(keepends=True)
    for index in reversed(range(len(tokens))):  # right to left: earlier columns stay valid
        token, before = tokens[index], [t.string for t in tokens[max(0, index - 2) : index]]
        attribute = before[-1:] == ["."]
        if token.type != tokenize.NAME or token.string not in neutral:
            continue
        if attribute and before != ["self", "."]:
            continue
        row, col = token.start[0] - 1, token.start[1]
        line = lines[row]
        lines[row] = line[:col] + neutral[token.string] + line[col + len(token.string) :]
    return "".join(lines)


def _kernelguard_reason(code: str) -> str:
    import kernelguard

    result = kernelguard.analyze_code(code, compute_structural_hash=False)
    if not result["should_filter"]:
        return ""
    names = sorted({hit.get("pattern", "?") for hit in result["matched_patterns"]})
    return f"{result['filter_reason']} ({', '.join(names)})"


def _kernelguard(source: str, kind: str) -> str:
    code = _without_comments(source, kind)
    reason = _kernelguard_reason(code)
    if reason and kind == "py" and not _kernelguard_reason(_renamed(code)):
        return ""  # it matched the candidate's own names, not what the code does
    return reason


# --- all checks ---------------------------------------------------------------------------------


def _low_precision(code: _Code) -> str:
    return code.find(_py_low_precision, _cpp_low_precision)


def static_checks(
    source: str,
    kind: str,
    reference_source: str,
    allowed: frozenset[str] = frozenset(),
    backend: str = "",
) -> list[Check]:
    """Every static check on a candidate: a failed check names what it found. `allowed`:
    the aten ops the policy lets torch compute (`--allow-torch`); a Triton candidate
    (`backend`) must launch a `@triton.jit` kernel."""
    code = _Code.read(source, kind)
    token_checks: dict[str, Callable[[], str]] = {
        "static.kernelguard": lambda: _kernelguard(source, kind),
        "static.frame_inspection": lambda: code.find(_py_frames, _never),
        "static.threads_streams": lambda: code.find(_py_async, _cpp_async),
    }
    if not _low_precision(_Code.read(reference_source, "py")):
        token_checks["static.precision_downcast"] = lambda: _low_precision(code)
    checks = [Check(name, not (found := run()), found) for name, run in token_checks.items()]
    if code.python is None:
        return checks
    tree, view = code.python.tree, code.python
    tree_checks: dict[str, Callable[[], str]] = {
        "static.reference_fallback": lambda: _reference_fallback(tree),
        "static.torch_compute": lambda: _torch_compute(tree, allowed),
        "static.try_except": lambda: _try_except(tree),
        "static.monkeypatch": lambda: _monkeypatch(view),
        "static.aten_override": lambda: _aten_override(view),
        "static.dynamic_code": lambda: _dynamic_code(view),
        "static.tensor_subclass": lambda: _tensor_subclass(tree),
    }
    if backend == "triton":
        tree_checks["static.triton_launch"] = lambda: triton_backend.unlaunched(source) or ""
    checks += [Check(name, not (found := run()), found) for name, run in tree_checks.items()]
    return checks
