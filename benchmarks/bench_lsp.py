"""Editor latency of htam-lsp: hover, code action and document symbols on big files.

    .venv/bin/python benchmarks/bench_lsp.py [--quick] [--sizes 1000 5000 20000]
        [--requests 200] [--out benchmarks/results/bench_lsp.json]

Talks to the real server process over stdio (as VS Code: UTF-16 positions) and times
each request's round trip, p50 and p99, on generated `.cu` and `.py` (load_inline)
files of each size: idle, and while a step runs (a real `htam optimize` job started
through the server; --quick uses a CPU-busy subprocess instead). Also: start-up time
(spawn to initialize answered) next to the floor of importing pygls, the first
symbols after opening (cold discovery) and hover right after an edit (incremental
re-parse). Target: p99 < 20 ms on 5,000 lines. Writes JSON (with a "markdown" key)
to --out and the Markdown next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pygls.protocol import default_converter
from pytest_lsp import client_capabilities

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 20.0
KERNEL = """__global__ void k{i}(const float* a, float* b, int rows, int cols) {{
    __shared__ float tile[256];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    float acc = 0.0f;
    for (int c = tid; c < cols; c += blockDim.x) {{
        float v = a[row * cols + c] * {i}.0f;
        acc += v * v;
    }}
    tile[tid] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (tid < s) {{
            tile[tid] += tile[tid + s];
        }}
        __syncthreads();
    }}
    if (tid == 0 && row < rows) {{
        b[row] = sqrtf(tile[0]);
    }}
}}

void launch{i}(const float* a, float* b, int rows, int cols) {{
    k{i}<<<rows, 256>>>(a, b, rows, cols);
}}

"""
PY_HEAD = (
    "# htam: reference=reference.py\n"
    "from torch.utils.cpp_extension import load_inline\n\n"
    'CUDA_SOURCE = r"""\n'
)
PY_TAIL = (
    '"""\n\nmod = load_inline(name="m", cpp_sources="", cuda_sources=CUDA_SOURCE)\n\n\n'
    "class ModelNew:\n    def forward(self, x):\n        return mod.launch0(x)\n"
)


def cuda_source(lines: int) -> str:
    """Realistic density: a 20-line reduction kernel and its launcher per 26 lines."""
    parts, count, i = [], 0, 0
    while count < lines:
        parts.append(KERNEL.format(i=i))
        count += KERNEL.count("\n")
        i += 1
    return "".join(parts)


def python_source(lines: int) -> str:
    return PY_HEAD + cuda_source(lines - 10) + PY_TAIL


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 0.99),
        "max_ms": max(ms),
    }


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


class RawClient:
    """A minimal JSON-RPC client over stdio: like an editor, it parses answers as plain JSON,
    so the times are the server's plus the transport, not a Python client's type mapping."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.ids = 0
        self.reader: asyncio.Task[None] | None = None

    async def start(self, env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "htam_lsp.server",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
            limit=64 * 1024 * 1024,
        )
        self.reader = asyncio.create_task(self._read())

    def _write(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream = self.proc.stdout
        while True:
            length = 0
            while (header := await stream.readline()) not in (b"\r\n", b""):
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            if not header:
                return
            message = json.loads(await stream.readexactly(length))
            if "method" in message and "id" in message:  # a request from the server
                result: list[dict[str, Any]] | None = (
                    [{}] if message["method"] == "workspace/configuration" else None
                )
                self._write({"id": message["id"], "result": result})
            elif message.get("method") == "htam/jobState":  # the rest would only grow the heap
                self.notifications.append(message)
            elif message.get("id") in self.pending:
                self.pending.pop(message["id"]).set_result(message)

    async def request(self, method: str, params: Any) -> Any:
        self.ids += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.ids] = future
        self._write({"id": self.ids, "method": method, "params": params})
        answer = await future
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result")

    def notify(self, method: str, params: Any) -> None:
        self._write({"method": method, "params": params})

    def job_states(self, job: str) -> list[str]:
        return [
            n["params"]["state"]
            for n in self.notifications
            if n["method"] == "htam/jobState" and n["params"]["jobId"] == job
        ]


class Session:
    """One server process and its client, initialized as VS Code (UTF-16 positions)."""

    def __init__(self, home: str, options: dict[str, Any]) -> None:
        self.home, self.options = home, options
        self.client = RawClient()

    async def start(self) -> float:
        started = time.perf_counter()
        await self.client.start({**os.environ, "HTAM_HOME": self.home})
        caps = default_converter().unstructure(client_capabilities("visual-studio-code"))
        await self.client.request(
            "initialize",
            {
                "processId": None,
                "rootUri": None,
                "capabilities": caps,
                "initializationOptions": self.options,
            },
        )
        elapsed = time.perf_counter() - started
        self.client.notify("initialized", {})
        return elapsed

    async def stop(self) -> None:
        await self.client.request("shutdown", None)
        self.client.notify("exit", None)
        assert self.client.proc is not None
        await self.client.proc.wait()

    def open(self, uri: str, language: str, text: str) -> None:
        item = {"uri": uri, "languageId": language, "version": 1, "text": text}
        self.client.notify("textDocument/didOpen", {"textDocument": item})


def import_floor() -> float:
    """Seconds to start Python and import pygls + lsprotocol: no pygls server starts faster."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import pygls.lsp.server"], check=True)
    return time.perf_counter() - started


def _position(line: int, character: int) -> dict[str, int]:
    return {"line": line, "character": character}


async def measure_file(
    session: Session, uri: str, text: str, n: int, rng: random.Random
) -> dict[str, Any]:
    c = session.client
    ident = {"uri": uri}
    gc.collect()
    gc.freeze()  # keep this client's own collections out of the server's times
    lines = [i for i, line in enumerate(text.splitlines()) if "float acc = 0.0f" in line]

    def spot() -> dict[str, int]:
        return _position(rng.choice(lines), 8)

    async def hover() -> Any:
        return await c.request("textDocument/hover", {"textDocument": ident, "position": spot()})

    async def action() -> Any:
        where = spot()
        params = {
            "textDocument": ident,
            "range": {"start": where, "end": where},
            "context": {"diagnostics": []},
        }
        return await c.request("textDocument/codeAction", params)

    async def symbols() -> Any:
        return await c.request("textDocument/documentSymbol", {"textDocument": ident})

    return {
        "hover": summary(await timed(hover, n)),
        "code_action": summary(await timed(action, n)),
        "document_symbol": summary(await timed(symbols, n)),
    }


async def hover_after_edit(
    session: Session, uri: str, text: str, n: int, rng: random.Random
) -> dict[str, float]:
    """An edit inside a kernel, then a hover on it: incremental re-parse + discovery."""
    c = session.client
    lines = [i for i, line in enumerate(text.splitlines()) if "acc += v * v;" in line]
    samples = []
    for version in range(2, n + 2):
        line = rng.choice(lines)
        start = time.perf_counter()
        where = _position(line, 8)
        c.notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"range": {"start": where, "end": where}, "text": " "}],
            },
        )
        await c.request(
            "textDocument/hover",
            {"textDocument": {"uri": uri}, "position": _position(line - 1, 8)},
        )
        samples.append(time.perf_counter() - start)
    return summary(samples)


async def start_step(session: Session, work: Path) -> tuple[str, str]:
    """A real `htam optimize` job through the server."""
    for name in ("cpu_naive.py", "reference.py"):
        shutil.copy(REPO / "examples" / "softmax" / name, work / name)
    task = work / "cpu_naive.py"
    session.open(task.as_uri(), "python", task.read_text())
    answer = await session.client.request(
        "workspace/executeCommand",
        {"command": "htam.optimize", "arguments": [{"uri": task.as_uri(), "steps": 8}]},
    )
    return "a real htam optimize job (offline, CPU, 8 steps, started through the server)", answer[
        "jobId"
    ]


def step_running(session: Session, job: str) -> bool:
    states = session.client.job_states(job)
    return bool(states) and states[-1] in ("queued", "running")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    home = tempfile.mkdtemp(prefix="htam-bench-lsp-")
    work = Path(tempfile.mkdtemp(prefix="htam-bench-lsp-files-"))
    options = {"allowExecution": True, "provider": "offline", "device": "cpu"}
    session = Session(home, options)
    startup = [await session.start()]
    for _ in range(2):
        other = Session(home, options)
        startup.append(await other.start())
        await other.stop()
    result: dict[str, Any] = {
        "startup_s": statistics.median(startup),
        "import_floor_s": statistics.median(import_floor() for _ in range(3)),
        "files": {},
    }
    files = {}
    for size in args.sizes:
        for kind, make, language in (("cu", cuda_source, "cuda"), ("py", python_source, "python")):
            text = make(size)
            uri = (work / f"bench_{size}.{kind}").as_uri()
            start = time.perf_counter()
            session.open(uri, language, text)
            first = await session.client.request(
                "textDocument/documentSymbol", {"textDocument": {"uri": uri}}
            )
            files[(size, kind)] = (uri, text)
            result["files"][f"{size}.{kind}"] = {
                "lines": text.count("\n"),
                "symbols": _count(first),
                "open_to_first_symbols_ms": (time.perf_counter() - start) * 1000,
                "idle": await measure_file(session, uri, text, args.requests, rng),
                "hover_after_edit": await hover_after_edit(
                    session, uri, text, max(args.requests // 4, 5), rng
                ),
            }
    load, job, burner = await start_load(session, work, args.quick)
    result["load"] = load
    for (size, kind), (uri, text) in files.items():
        measured = await measure_file(session, uri, text, args.requests, rng)
        result["files"][f"{size}.{kind}"]["during_step"] = measured
    if job is not None:
        result["step_running_throughout"] = step_running(session, job)
        await session.client.request(
            "workspace/executeCommand", {"command": "htam.cancel", "arguments": [{"jobId": job}]}
        )
    if burner is not None:
        burner.kill()
        burner.wait()
    await session.stop()
    shutil.rmtree(work, ignore_errors=True)
    return result


def _count(symbols: list[dict[str, Any]] | None) -> int:
    return sum(1 + _count(s.get("children")) for s in symbols or [])


async def start_load(
    session: Session, work: Path, quick: bool
) -> tuple[str, str | None, subprocess.Popen[bytes] | None]:
    if not quick:
        label, job = await start_step(session, work)
        await asyncio.sleep(5)  # past the worker's start-up, into compiling and timing
        if step_running(session, job):
            return label, job, None
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    return "a CPU-busy subprocess", None, burner


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Start-up (spawn to initialize answered): {result['startup_s'] * 1000:.0f} ms; "
        f"floor (python + import pygls): {result['import_floor_s'] * 1000:.0f} ms. "
        f"Load while a step runs: {result['load']}"
        + (
            f" (still running at the end: {result['step_running_throughout']})."
            if "step_running_throughout" in result
            else "."
        ),
        "",
        "| file | lines | symbols | request | idle p50 | idle p99 | during step p50 "
        "| during step p99 |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, data in result["files"].items():
        for request in ("hover", "code_action", "document_symbol"):
            idle, busy = data["idle"][request], data["during_step"][request]
            lines.append(
                f"| {name} | {data['lines']} | {data['symbols']} | {request} "
                f"| {idle['p50_ms']:.1f} ms "
                f"| {idle['p99_ms']:.1f} ms | {busy['p50_ms']:.1f} ms | {busy['p99_ms']:.1f} ms |"
            )
    lines += ["", "| file | first symbols after open | edit + hover p50 | edit + hover p99 |"]
    lines += ["|---|---:|---:|---:|"]
    for name, data in result["files"].items():
        edit = data["hover_after_edit"]
        lines.append(
            f"| {name} | {data['open_to_first_symbols_ms']:.0f} ms | {edit['p50_ms']:.1f} ms "
            f"| {edit['p99_ms']:.1f} ms |"
        )
    five = [d for d in result["files"].values() if 4000 <= d["lines"] <= 6000]
    worst = max(
        (
            d[c][r]["p99_ms"]
            for d in five
            for c in ("idle", "during_step")
            for r in ("hover", "code_action", "document_symbol")
        ),
        default=None,
    )
    if worst is not None:
        verdict = "met" if worst < TARGET_MS else "NOT met"
        lines += [
            "",
            f"Target p99 < {TARGET_MS:.0f} ms on 5,000 lines: {verdict} "
            f"(worst p99 {worst:.1f} ms).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="1k/5k lines, fewer requests, CPU-busy load"
    )
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--requests", type=int, help="requests per kind and condition")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON output (Markdown written next to it)")
    args = parser.parse_args()
    args.sizes = args.sizes or ([1000, 5000] if args.quick else [1000, 5000, 20000])
    args.requests = args.requests or (50 if args.quick else 200)
    result = asyncio.run(run(args))
    result["markdown"] = markdown(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(result["markdown"])
        print(f"wrote {args.out} and {args.out.with_suffix('.md')}", file=sys.stderr)
    print(result["markdown"])


if __name__ == "__main__":
    main()
