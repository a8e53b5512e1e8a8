"""Tree-sitter views of kernel code: parse trees, embedded sources, kernels, tags, family.

Pure and fast (no torch): the language server calls these on every edit. C++ is parsed
with the CUDA grammar, a superset of the C++ one.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache

import tree_sitter_cuda
import tree_sitter_python
from tree_sitter import Language, Node, Parser, Tree

from htam_engine.vocabulary import BACKENDS, LANGUAGES

SOURCE_KWARGS = {"cpp_sources": "cpp", "cuda_sources": "cuda"}
LOADERS = ("load_inline", "load_cpp")
LOOP_TYPES = ("for_statement", "while_statement", "do_statement")


@dataclass(frozen=True)
class Embedded:
    """C++/CUDA text held in a Python string literal passed to a loader.

    `start_byte`/`end_byte` delimit the literal's content in the file's UTF-8 bytes, so
    `file_bytes[start_byte:end_byte].decode() == text`; `start_point` is its (row, byte
    column). `name` is the module-level variable holding it, or `<call>.<keyword>`.
    """

    name: str
    language: str  # "cuda" | "cpp"
    start_byte: int
    end_byte: int
    start_point: tuple[int, int]
    text: str
    call: str  # "load_inline" | "load_cpp"
    call_start_byte: int


@dataclass(frozen=True)
class FunctionFacts:
    """What one C++/CUDA function definition is, independent of where it sits in the file
    (so it is cached by the function's text and survives edits elsewhere)."""

    name: str
    name_span: tuple[int, int]  # the name's bytes, relative to the function's start
    is_global: bool
    launches: tuple[str, ...]  # kernels it launches with <<<...>>>
    pointers: tuple[str, ...]  # pointer parameters, as written
    unrestricted: tuple[str, ...]  # the pointer parameters without __restrict__
    bounds_checked: bool  # a kernel that indexes by thread compares before it touches memory


@dataclass(frozen=True)
class KernelUnit:
    """A unit of code the editor and the loop work on, with byte ranges in the file.

    kind: "global" (a `__global__` kernel; `launchers` names the host functions that
    launch it), "host" (a host / extern "C" function), "model" (a Model/ModelNew class),
    "module" (a load_inline / load_cpp call), "triton" (a `@triton.jit` function with its
    decorators; `launchers` names the Python functions that launch it). `facts` is set for
    C++/CUDA functions.
    """

    name: str
    kind: str
    language: str
    start_byte: int
    end_byte: int
    name_start: int
    name_end: int
    launchers: tuple[str, ...] = ()
    facts: FunctionFacts | None = field(default=None, compare=False)

    @property
    def is_kernel(self) -> bool:
        """A unit HTAM optimizes: a CUDA or Triton kernel, a Model class or a plain C++ (CPU)
        function."""
        if self.kind == "host":
            return self.language == "cpp"
        return self.kind in ("global", "model", "triton")

    def shifted(self, delta: int) -> KernelUnit:
        """The same unit, `delta` bytes further into the file (an embedded source's place)."""
        return replace(
            self,
            start_byte=self.start_byte + delta,
            end_byte=self.end_byte + delta,
            name_start=self.name_start + delta,
            name_end=self.name_end + delta,
        )


@cache
def _parser(language: str) -> Parser:
    grammar = tree_sitter_python if language == "python" else tree_sitter_cuda
    return Parser(Language(grammar.language()))


def _as_bytes(source: str | bytes) -> bytes:
    return source.encode() if isinstance(source, str) else source


def parse(source: str | bytes, language: str) -> Tree:
    """Parse `source` as "cuda", "cpp" (CUDA grammar) or "python"."""
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; expected one of {LANGUAGES}")
    return _parser(language).parse(_as_bytes(source))


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node` (itself included), in document order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def text(node: Node | None) -> str:
    """The node's text; invalid UTF-8 (a user's broken file) becomes U+FFFD, never an error."""
    return "" if node is None or node.text is None else node.text.decode(errors="replace")


def has_errors(source: str | bytes, language: str) -> bool:
    """True when the parse tree holds ERROR or MISSING nodes."""
    return parse(source, language).root_node.has_error


# --- Python: embedded sources -------------------------------------------------------


def call_name(call: Node) -> str:
    func = call.child_by_field_name("function")
    if func is None:
        return ""
    return text(func).rsplit(".", 1)[-1]


def module_assignments(root: Node) -> dict[str, Node]:
    """Module-level `NAME = <value>` assignments (the last one wins)."""
    found: dict[str, Node] = {}
    for stmt in root.children:
        if stmt.type != "expression_statement" or not stmt.children:
            continue
        assign = stmt.children[0]
        left, right = assign.child_by_field_name("left"), assign.child_by_field_name("right")
        is_name = left is not None and left.type == "identifier"
        if assign.type == "assignment" and is_name and right is not None:
            found[text(left)] = right
    return found


def loader_calls(tree: Tree) -> list[Node]:
    """Calls to load_inline / load_cpp (any qualification) in a Python tree."""
    return [n for n in walk(tree.root_node) if n.type == "call" and call_name(n) in LOADERS]


def call_argument(call: Node, keyword: str, position: int | None = None) -> Node | None:
    """The value node of a keyword argument (or the positional one at `position`)."""
    args = call.child_by_field_name("arguments")
    if args is None:
        return None
    positional = [a for a in args.named_children if a.type not in ("keyword_argument", "comment")]
    for arg in args.named_children:
        if arg.type == "keyword_argument" and text(arg.child_by_field_name("name")) == keyword:
            return arg.child_by_field_name("value")
    if position is not None and position < len(positional):
        return positional[position]
    return None


def resolve(value: Node, assignments: dict[str, Node]) -> tuple[str | None, Node]:
    """Follow one module-level variable: (its name or None, the value node)."""
    if value.type == "identifier" and text(value) in assignments:
        return text(value), assignments[text(value)]
    return None, value


def _string_content(string: Node) -> tuple[int, int] | None:
    if string.type != "string" or any(c.type == "interpolation" for c in string.children):
        return None
    start = next(c for c in string.children if c.type == "string_start").end_byte
    end = next(c for c in string.children if c.type == "string_end").start_byte
    return start, end


def _source_values(call: Node) -> Iterator[tuple[str, str, Node]]:
    """(language, keyword, value node) for each source argument of a loader call."""
    if call_name(call) == "load_cpp":
        value = call_argument(call, "source", 1)
        if value is not None:
            yield "cpp", "source", value
        return
    for keyword, language in SOURCE_KWARGS.items():
        value = call_argument(call, keyword, 1 if keyword == "cpp_sources" else 2)
        if value is not None:
            yield language, keyword, value


def embedded_sources(python_source: str | bytes) -> list[Embedded]:
    """C++/CUDA sources passed as string literals (directly, in a list, or through a
    module-level variable) to `load_inline` (cpp_sources/cuda_sources) or `load_cpp`."""
    data = _as_bytes(python_source)
    tree = parse(data, "python")
    assignments = module_assignments(tree.root_node)
    found: dict[int, Embedded] = {}
    for call in loader_calls(tree):
        for language, keyword, value in _source_values(call):
            name, node = resolve(value, assignments)
            items = node.named_children if node.type in ("list", "tuple") else [node]
            for item in items:
                item_name, literal = resolve(item, assignments)
                span = _string_content(literal)
                if span is None or span[0] in found:
                    continue
                label = item_name or name or f"{call_name(call)}.{keyword}"
                found[span[0]] = Embedded(
                    name=label,
                    language=language,
                    start_byte=span[0],
                    end_byte=span[1],
                    start_point=_point(data, span[0]),
                    text=data[span[0] : span[1]].decode(errors="replace"),
                    call=call_name(call),
                    call_start_byte=call.start_byte,
                )
    return sorted(found.values(), key=lambda e: e.start_byte)


@lru_cache(maxsize=4)
def _line_starts(data: bytes) -> list[int]:
    """Byte offset of every line's start; computed once per text, not once per unit."""
    return [0, *(m.end() for m in re.finditer(b"\n", data))]


def _point(data: bytes, offset: int) -> tuple[int, int]:
    starts = _line_starts(data)
    row = bisect.bisect_right(starts, offset) - 1
    return row, offset - starts[row]


def flag_values(python_source: str | bytes, keyword: str) -> list[str]:
    """Every string in the `keyword` flags lists (e.g. "extra_cflags") of loader calls."""
    tree = parse(python_source, "python")
    assignments = module_assignments(tree.root_node)
    flags: list[str] = []
    for call in loader_calls(tree):
        position = 2 if call_name(call) == "load_cpp" and keyword == "extra_cflags" else None
        value = call_argument(call, keyword, position)
        if value is None:
            continue
        _, node = resolve(value, assignments)
        flags += [text(s)[1:-1] for s in node.named_children if s.type == "string"]
    return flags


# --- C++ / CUDA structure -----------------------------------------------------------


def functions(root: Node) -> list[Node]:
    """Function definitions outside any other function: at file scope and inside
    namespaces, `extern "C"` blocks, templates, `#if`/`#ifdef` branches and class bodies."""
    found: list[Node] = []
    stack = list(reversed(root.children))
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            found.append(node)
        else:
            stack.extend(reversed(node.children))
    return found


def function_name_node(fn: Node) -> Node | None:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return None if declarator is None else declarator.child_by_field_name("declarator")


def function_name(fn: Node) -> str:
    """The declared name (`Ops::scale` for an out-of-class method, `kernel` in a template)."""
    return text(function_name_node(fn))


def parameters(fn: Node) -> list[Node]:
    for node in walk(fn):
        if node.type == "parameter_list":
            return [p for p in node.named_children if p.type == "parameter_declaration"]
    return []


def pointer_declarator(param: Node) -> Node | None:
    declarator = param.child_by_field_name("declarator")
    return (
        declarator if declarator is not None and declarator.type == "pointer_declarator" else None
    )


def is_global(fn: Node) -> bool:
    return any(c.type == "__global__" for c in fn.children)


def launches(root: Node) -> list[Node]:
    """CUDA `kernel<<<grid, block>>>(...)` call expressions."""
    return [
        n
        for n in walk(root)
        if n.type == "call_expression" and any(c.type == "kernel_call_syntax" for c in n.children)
    ]


def launch_config(call: Node) -> list[Node]:
    """The expressions between `<<<` and `>>>` (grid, block, ...)."""
    syntax = next(c for c in call.children if c.type == "kernel_call_syntax")
    return list(syntax.named_children)


def loops(node: Node) -> list[Node]:
    return [n for n in walk(node) if n.type in LOOP_TYPES]


def innermost_loops(node: Node) -> list[Node]:
    return [n for n in loops(node) if len(loops(n)) == 1]


def loop_pragma(loop: Node) -> str:
    """The text of the `#pragma` right before `loop`, or ""."""
    previous = loop.prev_named_sibling
    if previous is not None and previous.type == "preproc_call":
        directive = text(previous.child_by_field_name("directive"))
        return text(previous).strip() if directive == "#pragma" else ""
    return ""


def constants(root: Node) -> dict[str, str]:
    """Compile-time integer constants: `#define N 16` and const/constexpr int declarations."""
    found: dict[str, str] = {}
    for node in walk(root):
        if node.type == "preproc_def":
            value = text(node.child_by_field_name("value")).strip()
            if value.isdigit():
                found[text(node.child_by_field_name("name"))] = value
        elif node.type == "declaration" and re.search(r"\b(const|constexpr)\b", text(node)):
            for decl in node.named_children:
                literal = decl.child_by_field_name("value")
                is_number = literal is not None and literal.type == "number_literal"
                if decl.type == "init_declarator" and is_number:
                    found[text(decl.child_by_field_name("declarator"))] = text(literal)
    return found


def is_fixed_trip(loop: Node, known: dict[str, str]) -> bool:
    """A `for` whose bound is a literal or a named compile-time constant."""
    if loop.type != "for_statement":
        return False
    condition = loop.child_by_field_name("condition")
    if condition is None or condition.type != "binary_expression":
        return False
    bound = condition.child_by_field_name("right")
    return bound is not None and (
        bound.type == "number_literal" or (bound.type == "identifier" and text(bound) in known)
    )


# --- kernels ------------------------------------------------------------------------

_FACTS: dict[bytes, FunctionFacts] = {}
_FACTS_LIMIT = 50_000
_RESTRICT = re.compile(r"__restrict(__)?\b")
_THREAD_INDEX = re.compile(r"\b(threadIdx|blockIdx)\b")
_COMPARISON = re.compile(r"[<>]=?")
MODEL_CLASSES = ("Model", "ModelNew")  # KernelBench's names


def function_facts(fn: Node) -> FunctionFacts:
    """The facts of one function definition, cached by its exact text: after an edit only
    the edited functions of a 20k-line file are looked at again."""
    key = fn.text or b""
    cached = _FACTS.get(key)
    if cached is None:
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.clear()
        cached = _FACTS[key] = _compute_facts(fn)
    return cached


def _compute_facts(fn: Node) -> FunctionFacts:
    name_node = function_name_node(fn) or fn
    pointers = tuple(text(p) for p in parameters(fn) if pointer_declarator(p) is not None)
    global_ = is_global(fn)
    indexes = _THREAD_INDEX.search(text(fn.child_by_field_name("body"))) is not None
    return FunctionFacts(
        name=function_name(fn),
        name_span=(name_node.start_byte - fn.start_byte, name_node.end_byte - fn.start_byte),
        is_global=global_,
        launches=tuple(text(c.child_by_field_name("function")) for c in launches(fn)),
        pointers=pointers,
        unrestricted=tuple(p for p in pointers if not _RESTRICT.search(p)),
        bounds_checked=not (global_ and indexes) or _has_guard(fn),
    )


def _has_guard(fn: Node) -> bool:
    """An if/loop condition or ternary that compares (the usual `if (i < n)` guard)."""
    for node in walk(fn):
        if node.type in ("if_statement", "while_statement", "for_statement"):
            condition = node.child_by_field_name("condition")
            if condition is not None and _COMPARISON.search(text(condition)):
                return True
        elif node.type == "conditional_expression":
            return True
    return False


def _cxx_kernels(root: Node, language: str) -> list[KernelUnit]:
    facts = [(fn, function_facts(fn)) for fn in functions(root)]
    launchers: dict[str, list[str]] = {}
    for _fn, f in facts:
        for target in f.launches:
            launchers.setdefault(target, []).append(f.name)
    return [
        KernelUnit(
            f.name,
            "global" if f.is_global else "host",
            language,
            fn.start_byte,
            fn.end_byte,
            fn.start_byte + f.name_span[0],
            fn.start_byte + f.name_span[1],
            tuple(launchers.get(f.name, ())) if f.is_global else (),
            f,
        )
        for fn, f in facts
    ]


def _python_unit(node: Node, kind: str, name_node: Node | None) -> KernelUnit:
    name = text(name_node).rsplit(".", 1)[-1]
    name_end = name_node.end_byte if name_node is not None else node.start_byte
    start, end = node.start_byte, node.end_byte
    return KernelUnit(name, kind, "python", start, end, name_end - len(name.encode()), name_end)


# --- Triton --------------------------------------------------------------------------

TRITON_LANGUAGE = ("tl.", "triton.language.")  # how kernels name triton.language


def decorator_name(decorator: Node) -> str:
    """`triton.jit` for `@triton.jit` and `@triton.jit(debug=True)` alike."""
    expression = decorator.named_children[0] if decorator.named_children else decorator
    if expression.type == "call":
        expression = expression.child_by_field_name("function") or expression
    return text(expression)


def _imports_jit_from_triton(root: Node) -> bool:
    return any(
        n.type == "import_from_statement"
        and text(n.child_by_field_name("module_name")) == "triton"
        and re.search(r"\bjit\b", text(n)) is not None
        for n in root.children
    )


def triton_functions(root: Node) -> list[Node]:
    """The decorated definitions that hold a `@triton.jit` (or `@jit` imported from
    triton) function, wherever they are declared."""
    jit_names = {"triton.jit", "jit"} if _imports_jit_from_triton(root) else {"triton.jit"}
    return [
        node
        for node in walk(root)
        if node.type == "decorated_definition"
        and any(c.type == "decorator" and decorator_name(c) in jit_names for c in node.children)
    ]


def decorators(definition: Node) -> list[str]:
    """The names of a decorated definition's decorators, outermost first."""
    return [decorator_name(c) for c in definition.children if c.type == "decorator"]


def _definition(decorated: Node) -> Node:
    return decorated.child_by_field_name("definition") or decorated


def launch_calls(root: Node, name: str) -> list[Node]:
    """Launches `name[grid](...)` of a Triton kernel."""
    return [
        n
        for n in walk(root)
        if n.type == "call"
        and (func := n.child_by_field_name("function")) is not None
        and func.type == "subscript"
        and text(func.child_by_field_name("value")).rsplit(".", 1)[-1] == name
    ]


def _enclosing_function(node: Node) -> str | None:
    parent = node.parent
    while parent is not None and parent.type != "function_definition":
        parent = parent.parent
    return None if parent is None else text(parent.child_by_field_name("name"))


def _triton_units(root: Node) -> list[KernelUnit]:
    units = []
    for decorated in triton_functions(root):
        name_node = _definition(decorated).child_by_field_name("name")
        calls = launch_calls(root, text(name_node))
        launchers = dict.fromkeys(f for c in calls if (f := _enclosing_function(c)))
        unit = _python_unit(decorated, "triton", name_node)
        units.append(replace(unit, launchers=tuple(launchers)))
    return units


EmbeddedTrees = Callable[[Embedded], Tree]


def kernels(
    source: str | bytes,
    language: str,
    tree: Tree | None = None,
    embedded_tree: EmbeddedTrees | None = None,
) -> list[KernelUnit]:
    """Kernel units in document order with byte ranges in `source`: C++/CUDA functions
    (wherever they are declared), or for Python the Model/ModelNew classes, the
    `@triton.jit` functions, the loader calls and the functions of their embedded sources.

    `tree` is `source` already parsed and `embedded_tree` gives an embedded source's tree:
    the language server passes its incrementally maintained ones.
    """
    data = _as_bytes(source)
    tree = tree or parse(data, language)
    if language != "python":
        return _cxx_kernels(tree.root_node, language)
    units = [
        _python_unit(node, "model", node.child_by_field_name("name"))
        for node in tree.root_node.children
        if node.type == "class_definition"
        and text(node.child_by_field_name("name")) in MODEL_CLASSES
    ]
    units += [
        _python_unit(call, "module", call.child_by_field_name("function"))
        for call in loader_calls(tree)
    ]
    units += _triton_units(tree.root_node)
    for emb in embedded_sources(data):
        sub = embedded_tree(emb) if embedded_tree else parse(emb.text, emb.language)
        units += [u.shifted(emb.start_byte) for u in _cxx_kernels(sub.root_node, emb.language)]
    return sorted(units, key=lambda u: u.start_byte)


# --- feature tags -------------------------------------------------------------------


def _cxx_sources(source: bytes, backend: str) -> tuple[list[str], list[str] | None]:
    """(C++/CUDA texts to inspect, compiler flags or None for a raw source)."""
    embedded = embedded_sources(source)
    if not embedded:
        return [source.decode(errors="replace")], None
    wanted = ("cuda", "cpp") if backend == "cuda" else ("cpp",)
    keyword = "extra_cuda_cflags" if backend == "cuda" else "extra_cflags"
    flags = flag_values(source, keyword)
    if backend == "cpu" and not any(f.startswith("-O") for f in flags):
        flags.append("-O2")  # the default of load_cpp
    return [e.text for e in embedded if e.language in wanted], flags


def _loop_tags(roots: list[Node], known: dict[str, str]) -> set[str]:
    tags: set[str] = set()
    all_loops = [loop for root in roots for loop in loops(root)]
    if all_loops:
        tags.add("loops")
    if any(len(loops(loop)) > 1 for loop in all_loops):
        tags.add("nested_loops")
    if any(is_fixed_trip(loop, known) for loop in all_loops):
        tags.add("fixed_trip_loop")
    return tags


def _restrict_tag(fns: list[Node]) -> set[str]:
    facts = [function_facts(fn) for fn in fns]
    if not any(f.pointers for f in facts):
        return set()
    return {"no_restrict" if any(f.unrestricted for f in facts) else "restrict_pointers"}


def _block_sizes(root: Node, known: dict[str, str]) -> list[int]:
    sizes = []
    for call in launches(root):
        config = launch_config(call)
        if len(config) >= 2:
            value = known.get(text(config[1]), text(config[1]))
            if value.isdigit():
                sizes.append(int(value))
    return sizes


CUDA_PATTERNS = {
    "shared_memory": r"__shared__",
    "vectorized_loads": r"\b(float[24]|int[24]|half2|__half2|double2)\b",
    "pragma_unroll": r"#pragma\s+unroll",
    "atomics": r"\batomic[A-Z]\w*\s*\(",
    "warp_shuffle": r"__shfl\w*",
    "syncthreads": r"__syncthreads\s*\(",
    "tensor_cores": r"\b(wmma::|mma\.sync|__hmma)|\bmma_sync\b",
    "half_precision": r"\b(half2?|__half2?|__nv_bfloat16|c10::Half|at::Half)\b",
}


def _cuda_tags(texts: list[str], flags: list[str] | None) -> set[str]:
    joined = "\n".join(texts)
    roots = [parse(t, "cuda").root_node for t in texts]
    known = {k: v for root in roots for k, v in constants(root).items()}
    kernels_ = [fn for root in roots for fn in functions(root) if is_global(fn)]
    tags = {tag for tag, pattern in CUDA_PATTERNS.items() if re.search(pattern, joined)}
    tags.add("shared_memory" if "shared_memory" in tags else "no_shared_memory")
    tags.add("vectorized_loads" if "vectorized_loads" in tags else "scalar_loads")
    striding = any("gridDim" in text(loop) for fn in kernels_ for loop in loops(fn))
    tags.add("grid_stride" if striding else "no_grid_stride")
    bounded = bool(kernels_) and all(
        any(c.type == "launch_bounds" for c in fn.children) for fn in kernels_
    )
    tags.add("launch_bounds" if bounded else "no_launch_bounds")
    tags |= _restrict_tag(kernels_) | _loop_tags(kernels_, known)
    if len(kernels_) > 1:
        tags.add("multiple_kernels")
    sizes = [s for root in roots for s in _block_sizes(root, known)]
    if any(s < 256 for s in sizes):
        tags.add("small_block")
    if any(s >= 512 for s in sizes):
        tags.add("large_block")
    fast = flags is not None and "--use_fast_math" in flags
    tags.add("fast_math" if fast else "no_fast_math")
    return tags


def _cpu_tags(texts: list[str], flags: list[str] | None) -> set[str]:
    joined = "\n".join(texts)
    roots = [parse(t, "cpp").root_node for t in texts]
    known = {k: v for root in roots for k, v in constants(root).items()}
    fns = [fn for root in roots for fn in functions(root)]
    tags = {"openmp" if re.search(r"#pragma\s+omp\s+(parallel|for)", joined) else "no_openmp"}
    simd = re.search(r"#pragma\s+(omp\s+(parallel\s+for\s+)?simd|GCC\s+ivdep)", joined)
    tags.add("simd_pragma" if simd else "no_simd")
    tags |= _restrict_tag(fns) | _loop_tags(fns, known)
    if any(is_blocked(loop) for fn in fns for loop in loops(fn)):
        tags.add("blocked_loops")
    if flags is not None:
        tags.add("opt_O3" if {"-O3", "-Ofast"} & set(flags) else "low_opt")
        if "-march=native" in flags:
            tags.add("march_native")
    return tags


def is_blocked(loop: Node) -> bool:
    """A tile loop: steps by more than one and holds a loop that starts at its variable."""
    if loop.type != "for_statement":
        return False
    update = loop.child_by_field_name("update")
    if update is None or update.type != "assignment_expression" or "+=" not in text(update):
        return False
    variable = text(update.child_by_field_name("left"))
    for inner in loops(loop)[1:]:
        init = inner.child_by_field_name("initializer")
        if init is not None and re.search(rf"\b{re.escape(variable)}\b", text(init)):
            return True
    return False


def tl_calls(root: Node) -> list[tuple[str, Node]]:
    """(name, call) for every `tl.NAME(...)` / `triton.language.NAME(...)` call."""
    found = []
    for node in walk(root):
        if node.type == "call":
            callee = text(node.child_by_field_name("function"))
            prefix = next((p for p in TRITON_LANGUAGE if callee.startswith(p)), None)
            if prefix is not None:
                found.append((callee[len(prefix) :], node))
    return found


def _keyword_values(root: Node, keyword: str) -> list[str]:
    """The text of every `keyword=value` argument under `root`."""
    return [
        text(n.child_by_field_name("value"))
        for n in walk(root)
        if n.type == "keyword_argument" and text(n.child_by_field_name("name")) == keyword
    ]


def _memory_tags(calls: list[tuple[str, Node]]) -> set[str]:
    access = [(name, call) for name, call in calls if name in ("load", "store")]
    if not access:
        return set()
    guarded = any(
        call_argument(call, "mask", 1 if name == "load" else 2) is not None
        or call_argument(call, "boundary_check") is not None
        for name, call in access
    )
    hinted = any(_keyword_values(call, k) for _, call in access for k in EVICTION_KEYWORDS)
    blocked = any(name in BLOCK_POINTERS for name, _ in calls)
    tags = {"masked" if guarded else "unmasked", "block_ptr" if blocked else "no_block_ptr"}
    return tags | ({"eviction_hints"} if hinted else set())


def _is_ieee(dot: Node) -> bool:
    precision = call_argument(dot, "input_precision")
    allow = call_argument(dot, "allow_tf32")
    return (precision is not None and text(precision).strip("\"'") == "ieee") or (
        allow is not None and text(allow) == "False"
    )


def _dot_tags(kernels_: list[Node], calls: list[tuple[str, Node]]) -> set[str]:
    dots = [call for name, call in calls if name == "dot"]
    if not dots:
        return set()
    tags = {"tl_dot", "ieee_dot" if all(map(_is_ieee, dots)) else "tf32_dot"}
    if any(any(n in dots for n in walk(loop)) for fn in kernels_ for loop in _py_loops(fn)):
        tags.add("k_loop")
    grouped = any(name == "swizzle2d" for name, _ in calls) or any(
        re.search(r"\bGROUP\w*", text(fn.child_by_field_name("parameters")))
        for fn in map(_definition, kernels_)
    )
    return tags | {"grouped_ordering" if grouped else "no_grouping"}


def _py_loops(node: Node) -> list[Node]:
    return [n for n in walk(node) if n.type in ("for_statement", "while_statement")]


def _triton_loop_tags(kernels_: list[Node]) -> set[str]:
    all_loops = [loop for fn in kernels_ for loop in _py_loops(fn)]
    tags = {"loops"} if all_loops else set()
    if any(len(_py_loops(loop)) > 1 for loop in all_loops):
        tags.add("nested_loops")
    if any("num_programs" in text(loop.child_by_field_name("right")) for loop in all_loops):
        tags.add("persistent")
    return tags


def _launch_tags(root: Node, kernels_: list[Node]) -> set[str]:
    tuned = any("triton.autotune" in decorators(k) for k in kernels_)
    tags = {"autotune" if tuned else "no_autotune"}
    tags.add("num_warps_set" if _keyword_values(root, "num_warps") else "default_warps")
    tags.add("num_stages_set" if _keyword_values(root, "num_stages") else "default_stages")
    return tags | ({"multiple_kernels"} if len(kernels_) > 1 else set())


EVICTION_KEYWORDS = ("eviction_policy", "cache_modifier")
BLOCK_POINTERS = ("make_block_ptr", "advance", "make_tensor_descriptor")
TRITON_HALF = r"\b(tl|torch)\.(float16|bfloat16|half|float8\w*)\b|\.half\(\)"


def _triton_tags(source: bytes) -> set[str]:
    """Tags of the `@triton.jit` kernels in a Python file (or one kernel's text) and of
    the launches and autotune configs around them."""
    root = parse(source, "python").root_node
    kernels_ = triton_functions(root)
    if not kernels_:
        return set()
    calls = [c for k in kernels_ for c in tl_calls(k)]
    tags = _memory_tags(calls) | _dot_tags(kernels_, calls) | _triton_loop_tags(kernels_)
    tags |= _launch_tags(root, kernels_)
    if any(name.startswith("atomic_") for name, _ in calls):
        tags.add("atomics")
    if re.search(TRITON_HALF, source.decode(errors="replace")):
        tags.add("half_precision")
    return tags


def features(source: str | bytes, backend: str) -> set[str]:
    """Static feature tags (docs/ARCHITECTURE.md vocabulary) of a .py with embedded
    sources or a raw .cu/.cpp file (backend "cuda" or "cpu"), or of the `@triton.jit`
    kernels of a .py (backend "triton")."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "triton":
        return _triton_tags(_as_bytes(source))
    texts, flags = _cxx_sources(_as_bytes(source), backend)
    return _cuda_tags(texts, flags) if backend == "cuda" else _cpu_tags(texts, flags)


# --- operator family ----------------------------------------------------------------

MATMUL_OPS = {"matmul", "mm", "bmm", "linear", "Linear", "addmm", "baddbmm", "einsum", "@"}
MATMUL_OPS |= {"Conv1d", "Conv2d", "Conv3d", "conv1d", "conv2d", "conv3d"}
REDUCTION_OPS = {
    "softmax", "log_softmax", "Softmax", "LogSoftmax", "sum", "mean", "amax", "amin",
    "argmax", "argmin", "max", "min", "norm", "layer_norm", "LayerNorm", "group_norm",
    "GroupNorm", "batch_norm", "BatchNorm1d", "BatchNorm2d", "logsumexp", "cumsum",
    "cumprod", "var", "std", "prod", "rms_norm", "RMSNorm", "normalize",
}  # fmt: skip
ELEMENTWISE_OPS = {
    "relu", "ReLU", "gelu", "GELU", "sigmoid", "Sigmoid", "tanh", "Tanh", "exp", "log",
    "sqrt", "rsqrt", "abs", "clamp", "clip", "add", "sub", "mul", "div", "pow", "silu",
    "SiLU", "elu", "ELU", "leaky_relu", "LeakyReLU", "hardtanh", "Hardtanh", "softplus",
    "Softplus", "mish", "Mish", "hardswish", "Hardswish", "selu", "SELU", "erf", "where",
    "maximum", "minimum", "neg", "reciprocal", "square", "+", "-", "*", "/", "**",
}  # fmt: skip


def _op_category(name: str) -> str | None:
    for category, ops in (
        ("matmul", MATMUL_OPS),
        ("reduction", REDUCTION_OPS),
        ("elementwise", ELEMENTWISE_OPS),
    ):
        if name in ops:
            return category
    return None


def _class(root: Node, names: tuple[str, ...]) -> Node | None:
    for name in names:
        for node in root.children:
            if node.type == "class_definition" and text(node.child_by_field_name("name")) == name:
                return node
    return None


def _method(cls: Node, name: str) -> Node | None:
    body = cls.child_by_field_name("body")
    for node in body.named_children if body is not None else []:
        if node.type == "function_definition" and text(node.child_by_field_name("name")) == name:
            return node
    return None


def _submodules(cls: Node) -> dict[str, str]:
    """`self.x = nn.Something(...)` in __init__: attribute -> class name."""
    init = _method(cls, "__init__")
    found: dict[str, str] = {}
    for node in walk(init) if init is not None else []:
        if node.type == "assignment":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and right is not None and right.type == "call":
                found[text(left)] = call_name(right)
    return found


def _own_nodes(fn: Node) -> Iterator[Node]:
    """The nodes of a function outside the functions and lambdas defined in it (a Triton
    launch's grid function computes launch sizes, not the operator)."""
    stack = list(reversed(fn.children))
    while stack:
        node = stack.pop()
        yield node
        if node.type not in ("function_definition", "lambda"):
            stack.extend(reversed(node.children))


def _forward_ops(cls: Node) -> list[str]:
    forward = _method(cls, "forward")
    if forward is None:
        return []
    modules = _submodules(cls)
    ops = []
    for node in _own_nodes(forward):
        if node.type == "call":
            callee = text(node.child_by_field_name("function"))
            ops.append(modules.get(callee, callee.rsplit(".", 1)[-1]))
        elif node.type in ("binary_operator", "augmented_assignment"):
            operator = node.child_by_field_name("operator")
            ops.append(text(operator).rstrip("="))
    return ops


def family(source: str | bytes) -> str:
    """Operator family from the torch ops in `Model.forward` (else `ModelNew.forward`)."""
    root = parse(source, "python").root_node
    cls = _class(root, ("Model", "ModelNew"))
    if cls is None:
        return "unknown"
    categories = {c for c in map(_op_category, _forward_ops(cls)) if c is not None}
    if not categories:
        return "unknown"
    if len(categories) == 1:
        return categories.pop()
    return "fused"
