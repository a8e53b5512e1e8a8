"""CUDA compile checks with nvcc on a machine without a GPU, sandboxed as a worker is."""

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.candidates import MODES, sandboxed

from htam_engine.evaluate import evaluate
from htam_engine.evaluate.excerpt import MAX_LOG, first_error, line_from_log, own_lines
from htam_engine.evaluate.nvcc import RESIDENT_MB, cuda_source, nvcc_check
from htam_engine.machine import gpu_present
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
KERNEL = """__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


@needs_nvcc
def test_valid_kernel_compiles():
    checked = nvcc_check(KERNEL, timeout_s=120)
    assert checked.compiled and checked.status == "compiled", checked.log


@needs_nvcc
def test_broken_kernel_reports_the_line():
    broken = KERNEL.replace("2.0f * x[i];", "2.0f * x[i]\n    return undeclared;")
    checked = nvcc_check(broken, timeout_s=120)
    assert checked.status == "rejected" and "error" in checked.log
    assert line_from_log(checked.log, broken) == 4  # nvcc reports the statement after the gap


@needs_nvcc
def test_nvcc_over_its_limit_is_a_timeout_not_a_rejection():
    checked = nvcc_check(KERNEL, timeout_s=0.01)
    assert checked.status == "timeout" and not checked.compiled
    assert "over its limit" in checked.log


def test_cuda_source_found_inside_a_load_inline_candidate():
    source = (FIXTURES / "matmul" / "tiled.py").read_text()
    code = cuda_source(source, "py")
    assert code is not None and "__global__ void matmul_tiled" in code


@needs_nvcc
@pytest.mark.skipif(gpu_present(), reason="checks the no-GPU path; this machine has a GPU")
def test_cuda_task_without_gpu_is_compile_checked_then_no_gpu(tmp_path):
    (tmp_path / "reference.py").write_text((FIXTURES / "reference.py").read_text())
    kernel = tmp_path / "scale.cu"
    kernel.write_text("// htam: reference=reference.py entry=scale\n" + KERNEL)
    task = load_task(kernel)
    verdict = evaluate(task, kernel.read_text(), use_cache=False)
    assert verdict.device == "cuda" and verdict.compiled
    assert verdict.error is not None and verdict.error.kind == "no_gpu"


# The compile check reads candidate-written text: it runs sandboxed, and its log keeps
# only what concerns the candidate's own file.
FAKE_NVCC = FIXTURES / "fake_nvcc"


@needs_nvcc
@pytest.mark.parametrize("mode", MODES)
def test_an_included_file_never_reaches_the_log(mode, monkeypatch):
    secret = Path("/etc/passwd").read_text().splitlines()[0]
    source = '#include "/etc/passwd"\n' + KERNEL
    with sandboxed(mode, monkeypatch):
        checked = nvcc_check(source, timeout_s=120)
    assert checked.status == "rejected"
    assert secret not in checked.log and "root" not in checked.log, checked.log


@needs_nvcc
def test_including_dev_zero_is_stopped_by_the_memory_cap_not_the_clock():
    started = time.monotonic()
    checked = nvcc_check('#include "/dev/zero"\n' + KERNEL, timeout_s=240)
    assert checked.status == "rejected", checked.log
    assert time.monotonic() - started < 200
    assert len(checked.log) <= MAX_LOG
    assert f"held over {RESIDENT_MB} MB" in checked.log  # all its processes together


def test_own_lines_drop_what_a_compiler_quotes_from_other_files():
    log = (
        "/etc/passwd(1): error: this declaration has no storage class\n"
        "  root:x:0:0:root:/root:/bin/bash\n"
        "  ^\n"
        'kernel.cu(3): error: identifier "y" is undefined\n'
        "  y[i] = 2;\n"
        "/etc/hostname:1:1: error: 'myhost' does not name a type\n"
        "    1 | myhost\n"
        "In file included from /tmp/x/main.cpp:2:\n"
        "/tmp/x/main.cpp:4:5: error: expected ';'\n"
    )
    kept = own_lines(log, {"kernel.cu", "main.cpp"})
    assert "root" not in kept and "myhost" not in kept
    assert 'identifier "y"' in kept and "y[i] = 2;" in kept and "main.cpp:4:5" in kept
    assert "myhost" not in first_error(log) and "root" not in first_error(log)


@pytest.fixture
def fake_nvcc(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE_NVCC}:{os.environ['PATH']}")
    assert shutil.which("nvcc") == str(FAKE_NVCC / "nvcc")


@pytest.mark.parametrize("mode", MODES)
def test_nvcc_gets_the_allowlist_and_a_box_for_its_home(mode, monkeypatch, fake_nvcc, htam_home):
    monkeypatch.setenv("DB_PASSWORD", "hunter2")
    monkeypatch.setenv("AWS_SESSION_CREDENTIALS", "sk-test")
    htam_home.mkdir(parents=True, exist_ok=True)
    (htam_home / "memory.db").write_text("learned")
    with sandboxed(mode, monkeypatch):
        checked = nvcc_check(f"// read: {htam_home / 'memory.db'}\n" + KERNEL, timeout_s=60)
    assert checked.status == "rejected"
    assert "hunter2" not in checked.log and "sk-test" not in checked.log
    assert "HTAM_HOME" not in checked.log and "HOME=/tmp/htam-nvcc-" in checked.log
    seen = "hidden" if mode == "bwrap" else "read"  # without bwrap the files stay reachable
    assert f"{seen} {htam_home / 'memory.db'}" in checked.log


def _mentioning(text: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_nvcc_and_its_children_die_with_htam_eval(mode, signum, monkeypatch, fake_nvcc, tmp_path):
    token = secrets.token_hex(8)
    (tmp_path / "reference.py").write_text((FIXTURES / "reference.py").read_text())
    kernel = tmp_path / "scale.cu"
    kernel.write_text(f"// htam: reference=reference.py entry=scale\n// hang: {token}\n{KERNEL}")
    with sandboxed(mode, monkeypatch):
        command = [sys.executable, "-m", "htam_engine.cli", "eval", str(kernel), str(kernel)]
        caller = subprocess.Popen([*command, "--device", "cpu", "--json"], env=dict(os.environ))
        try:
            deadline = time.monotonic() + 60
            # `setsid` forks on its way to the stand-in cicc: three for a moment, then two
            while len(_mentioning(f"-{token}")) != 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(_mentioning(f"-{token}")) == 2, "the stand-in nvcc did not start"
            caller.send_signal(signum)
            caller.wait(timeout=30)
            deadline = time.monotonic() + 10
            while _mentioning(f"-{token}") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _mentioning(f"-{token}"), "nvcc's tree outlived its caller"
        finally:
            caller.kill()
            for pid in _mentioning(f"-{token}"):
                os.kill(pid, signal.SIGKILL)
