"""Static checks read tokens: identifiers, strings and comments never trigger, the code
they name does (however it is spelled: aliases, `getattr`, string concatenation, macros)."""

from __future__ import annotations

from pathlib import Path

import pytest

from htam_engine.evaluate.static import static_checks

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
REPO = Path(__file__).resolve().parent.parent
REFERENCE = (FIXTURES / "reference.py").read_text()
CORRECT = (FIXTURES / "correct.py").read_text()
HONEST = sorted((FIXTURES / "honest").iterdir())
EXAMPLES = sorted(p for p in REPO.glob("examples/*/*_naive.py"))
LOOP = "    for (long i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;\n"
FORWARD = "        x = x.contiguous()\n"


def failed(source: str, kind: str = "py", reference: str = REFERENCE) -> dict[str, str]:
    return {c.name: c.detail for c in static_checks(source, kind, reference) if not c.passed}


def with_cpp(line: str) -> str:
    """The honest candidate with one more C++ line in its kernel's loop body."""
    assert LOOP in CORRECT
    return CORRECT.replace(LOOP, line + LOOP)


def with_python(lines: str, where: str = FORWARD) -> str:
    assert where in CORRECT
    return CORRECT.replace(where, lines + where)


@pytest.mark.parametrize("path", HONEST + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_honest_set_passes_every_static_check(path: Path) -> None:
    kind = "cu" if path.suffix == ".cu" else "py"
    reference = (path.parent / "reference.py").read_text() if path in EXAMPLES else REFERENCE
    assert failed(path.read_text(), kind, reference) == {}


@pytest.mark.parametrize(
    "source",
    [
        with_cpp("    long half = n / 2; (void)half;\n"),
        with_cpp("    // std::thread t(work); __half h; pthread_create(...)\n"),
        with_cpp('    const char* why = "no std::thread, no half2"; (void)why;\n'),
        with_cpp("    /* __float2half(x[i]) would be a downcast */\n"),
        with_python('        """threading, asyncio, torch.cuda.Stream: not used."""\n'),
        with_python("        # import threading; torch.float16; sys._getframe(1)\n"),
        with_python("        threading, half, f_back = 1, x.numel() // 2, None\n"),
        with_python('        label = "float16 / bfloat16 / half are not used here"\n'),
        with_python("        self.half = x.shape[0] // 2\n"),
        CORRECT.replace("import ctypes\n", "import ctypes\nimport re\n")
        + "\n\ndef compile(text):\n    return re.compile(text)\n\n\n_rx = compile(str(1))\n",
    ],
    ids=[
        "cpp-half-variable",
        "cpp-comment",
        "cpp-string",
        "cpp-block-comment",
        "py-docstring",
        "py-comment",
        "py-local-names",
        "py-string",
        "py-attribute-named-half",
        "own-compile-and-re-compile",
    ],
)
def test_identifiers_strings_and_comments_never_trigger(source: str) -> None:
    assert failed(source) == {}


@pytest.mark.parametrize(
    ("source", "check"),
    [
        (with_cpp("    std::thread t([] {}); t.detach();\n"), "static.threads_streams"),
        (with_cpp("    auto f = std::async([] {});\n"), "static.threads_streams"),
        (
            CORRECT.replace('extern "C"', '#define SPAWN std::thread\nextern "C"'),
            "static.threads_streams",
        ),
        (with_python("        import threading as t\n"), "static.threads_streams"),
        (with_python('        w = __import__("thread" + "ing")\n'), "static.threads_streams"),
        (with_python("        s = torch.cuda.Stream()\n"), "static.threads_streams"),
        (with_python("        import torch.multiprocessing as mp\n"), "static.threads_streams"),
        (with_python("        f = torch.jit.fork(len, x)\n"), "static.threads_streams"),
        (
            with_python('        __import__("os").posix_spawn("/bin/sh", [], {})\n'),
            "static.threads_streams",
        ),
        (with_python("        import subprocess\n"), "static.threads_streams"),
        (with_python('        exec("import threading")\n'), "static.threads_streams"),
        (
            with_python("        exec(\"exec('import thread' + 'ing')\")\n"),
            "static.threads_streams",
        ),
        (
            with_python('        getattr(__builtins__, "__import__")("threading")\n'),
            "static.threads_streams",
        ),
        (with_python('        exec(bytes.fromhex("00").decode())\n'), "static.dynamic_code"),
        (with_cpp("    if (fork() == 0) { setsid(); }\n"), "static.threads_streams"),
        (with_cpp("    at::launch([] {});\n"), "static.threads_streams"),
        (
            with_python("        f = sys._getframe(1)\n").replace(
                "import ctypes\n", "import sys\n"
            ),
            "static.frame_inspection",
        ),
        (
            with_python('        f = getattr(__import__("sys"), "_getframe")(1)\n'),
            "static.frame_inspection",
        ),
        (
            CORRECT.replace("import ctypes\n", "import ctypes\nfrom inspect import stack\n")
            + "\n_callers = stack()\n",
            "static.frame_inspection",
        ),
        (with_cpp("    half h = x[0]; (void)h;\n"), "static.precision_downcast"),
        (with_cpp("    y[0] = __half2float(__float2half(x[0]));\n"), "static.precision_downcast"),
        (with_python("        x = x.half().float()\n"), "static.precision_downcast"),
        (with_python("        x = x.to(torch.bfloat16).float()\n"), "static.precision_downcast"),
        (
            CORRECT.replace("import torch\n", "import torch\nfrom torch import float16 as lo\n")
            + "\n_lo = lo\n",
            "static.precision_downcast",
        ),
        (CORRECT + '\nvars(torch)["relu"] = lambda x: x\n', "static.monkeypatch"),
        (
            CORRECT + '\n_t = __import__("time")\n_t.perf_counter = lambda: 0.0\n',
            "static.monkeypatch",
        ),
        (CORRECT + "\nimport numpy as n\nn.allclose = lambda *a: True\n", "static.monkeypatch"),
    ],
    ids=[
        "std-thread",
        "std-async",
        "thread-in-a-macro",
        "import-alias",
        "import-by-concatenated-string",
        "torch-stream",
        "torch-multiprocessing",
        "torch-jit-fork",
        "os-posix-spawn",
        "subprocess",
        "exec-of-a-constant",
        "nested-exec",
        "import-through-getattr-on-builtins",
        "exec-of-computed-code",
        "cpp-fork-setsid",
        "aten-launch",
        "sys-getframe",
        "getframe-by-getattr",
        "inspect-stack-imported",
        "cpp-half-type",
        "cpp-half-intrinsics",
        "tensor-half-method",
        "torch-bfloat16",
        "float16-imported-under-another-name",
        "vars-torch",
        "aliased-time-module",
        "aliased-numpy",
    ],
)
def test_code_that_does_it_is_caught_however_spelled(source: str, check: str) -> None:
    assert check in failed(source), failed(source)


def test_a_cu_file_is_read_as_tokens_too() -> None:
    honest = (FIXTURES / "honest" / "current_stream.cu").read_text()
    spawning = honest.replace(
        "    return y;", "    cudaStream_t s; cudaStreamCreate(&s);\n    return y;"
    )
    assert "static.threads_streams" in failed(spawning, "cu")
    downcast = honest.replace("long half = n / 2;", "__half half = __float2half(x[0]);")
    assert "static.precision_downcast" in failed(downcast, "cu")


def test_the_reference_exempts_half_precision_only_by_its_code_not_its_words() -> None:
    downcast = with_cpp("    half h = x[0]; (void)h;\n")
    wordy = REFERENCE.replace('"""ReLU', '"""ReLU (not in half precision, not float16)')
    assert "static.precision_downcast" in failed(downcast, reference=wordy)
    half_reference = REFERENCE.replace("torch.randn(64, 256)", "torch.randn(64, 256).half()")
    assert "static.precision_downcast" not in failed(downcast, reference=half_reference)


def test_a_finding_names_the_line_and_the_token() -> None:
    source = with_python("        import threading as t\n")
    line = source.splitlines().index("        import threading as t") + 1
    assert failed(source)["static.threads_streams"] == f"line {line}: imports threading"


def test_kernelguard_reads_code_not_docstrings_comments_or_the_candidates_names() -> None:
    docstring = CORRECT.replace(
        "import ctypes\n", '"""Never do torch.cuda.synchronize = lambda: None."""\nimport ctypes\n'
    )
    named = CORRECT + "\n\nclass FakeTimerEvent:\n    pass\n"
    assert failed(docstring) == {}
    assert failed(named) == {}
    forged = CORRECT + "\ntorch.cuda.synchronize = lambda: None\n"
    assert "static.kernelguard" in failed(forged)


@pytest.mark.parametrize(
    ("fixture", "check"),
    [
        ("cheats/side_thread.py", "static.threads_streams"),
        ("cheats/monkeypatch_timer.py", "static.monkeypatch"),
    ],
)
def test_spellings_that_hid_from_the_text_checks_are_read(fixture: str, check: str) -> None:
    assert check in failed((FIXTURES / fixture).read_text())


@pytest.mark.parametrize("fixture", ["side_thread_dynamic.py", "monkeypatch_timer_dynamic.py"])
def test_names_computed_at_run_time_are_left_to_the_runtime_checks(fixture: str) -> None:
    """These variants exist so the pipeline tests still reach the runtime checks."""
    assert failed((FIXTURES / "cheats" / fixture).read_text()) == {}
