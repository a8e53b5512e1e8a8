"""Editor latency of htam-lsp next to a reference Python language server, in one run.

    .venv/bin/python benchmarks/bench_lsp.py [--quick] [--sizes 1000 5000 20000]
        [--requests 200] [--baseline DIR] [--out benchmarks/results/bench_lsp.json]

Talks to each server process over stdio (as VS Code: UTF-16 positions) and times each
request's round trip, p50 and p99, on generated `.cu` and `.py` (load_inline) files of
each size: idle, and while a step runs. The servers: htam-lsp (this checkout);
jedi-language-server on the same `.py` files with the same requests at the same
positions (the reference point); with --baseline DIR, htam-lsp from another checkout
(e.g. `git worktree add DIR <commit>`) for before/after ratios. "While a step runs":
htam-lsp runs a real `htam optimize` job it started itself; the other servers run next
to the same `htam optimize` command as a plain subprocess; --quick uses a CPU-busy
subprocess for every server. Also: start-up (spawn to initialize answered) next to the
floors `python -c "import lsprotocol.types"` and `import pygls.lsp.server`, the first
symbols after opening (cold discovery) and hover right after an edit. Target: p99 <
20 ms on 5,000 lines. Writes JSON (with a "markdown" key) to --out and the Markdown
next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pygls.protocol import default_converter
from pytest_lsp import client_capabilities

from htam_lsp.jobs import optimize_argv
from htam_lsp.settings import Settings

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 20.0
MIN_SAMPLES = 3
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


async def timed(call: Callable[[], Awaitable[Any]], n: int, budget_s: float) -> list[float]:
    """`n` round trips, or fewer once `budget_s` is spent (a slow server; "n" says how many)."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < n and (len(samples) < MIN_SAMPLES or time.perf_counter() < deadline):
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

    async def start(self, server: Server) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *server.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=server.env,
            cwd=server.cwd,
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


@dataclass(frozen=True)
class Server:
    """A language server to measure: its command, and the file kinds it reads."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    kinds: tuple[str, ...]
    runs_jobs: bool  # htam-lsp: the load is a job it runs itself


def servers(args: argparse.Namespace, home: Path) -> list[Server]:
    """htam-lsp, its --baseline checkout if given, and jedi-language-server if installed."""

    def env(name: str, **extra: str) -> dict[str, str]:
        (home / name).mkdir(exist_ok=True)
        return {**os.environ, "HTAM_HOME": str(home / name), **extra}

    htam = (sys.executable, "-m", "htam_lsp.server")
    found = [Server("htam-lsp", htam, env("htam"), str(REPO), ("cu", "py"), True)]
    if args.baseline is not None:
        where = str(args.baseline.resolve())  # first on sys.path: its htam_lsp and htam_engine
        name = f"htam-lsp@{_commit(args.baseline)}"
        found.append(Server(name, htam, env("base", PYTHONPATH=where), where, ("cu", "py"), True))
    jedi = shutil.which("jedi-language-server", path=str(Path(sys.executable).parent))
    if jedi and not args.no_reference:
        found.append(
            Server("jedi-language-server", (jedi,), env("jedi"), str(home), ("py",), False)
        )
    return found


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or checkout.name


class Session:
    """One server process and its client, initialized as VS Code (UTF-16 positions)."""

    def __init__(self, server: Server, options: dict[str, Any]) -> None:
        self.server, self.options = server, options
        self.client = RawClient()

    async def start(self) -> float:
        started = time.perf_counter()
        await self.client.start(self.server)
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


def import_time(module: str) -> float:
    """Seconds to start Python and import `module`: a floor for any server that needs it."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.perf_counter() - started


def _position(line: int, character: int) -> dict[str, int]:
    return {"line": line, "character": character}


async def measure_file(
    session: Session, uri: str, text: str, n: int, rng: random.Random, budget_s: float
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
        "hover": summary(await timed(hover, n, budget_s)),
        "code_action": summary(await timed(action, n, budget_s)),
        "document_symbol": summary(await timed(symbols, n, budget_s)),
    }


async def hover_after_edit(
    session: Session, uri: str, text: str, n: int, rng: random.Random, budget_s: float
) -> dict[str, float]:
    """An edit inside a kernel, then a hover on it: incremental re-parse + discovery."""
    c = session.client
    lines = [i for i, line in enumerate(text.splitlines()) if "acc += v * v;" in line]
    versions = iter(range(2, 2**31))

    async def edit_and_hover() -> Any:
        line = rng.choice(lines)
        where = _position(line, 8)
        c.notify(
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": next(versions)},
                "contentChanges": [{"range": {"start": where, "end": where}, "text": " "}],
            },
        )
        return await c.request(
            "textDocument/hover",
            {"textDocument": {"uri": uri}, "position": _position(line - 1, 8)},
        )

    return summary(await timed(edit_and_hover, n, budget_s))


OPTIONS = {"allowExecution": True, "provider": "offline", "device": "cpu"}
REQUESTS = ("hover", "code_action", "document_symbol")
STEP_LABEL = "a real htam optimize job (offline, CPU, 8 steps)"


@dataclass
class Load:
    """What runs next to the server while it is measured "during a step"."""

    label: str
    job: str | None = None  # a job of the server itself
    proc: subprocess.Popen[bytes] | None = None  # a process in a session of its own

    def running(self, session: Session) -> bool:
        if self.job is not None:
            states = session.client.job_states(self.job)
            return bool(states) and states[-1] in ("queued", "running")
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, session: Session) -> None:
        if self.job is not None:
            cancel = {"command": "htam.cancel", "arguments": [{"jobId": self.job}]}
            await session.client.request("workspace/executeCommand", cancel)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def start_load(session: Session, work: Path, quick: bool) -> Load:
    """The same step for every server: through htam-lsp itself, else as a subprocess."""
    if not quick:
        for name in ("cpu_naive.py", "reference.py"):
            shutil.copy(REPO / "examples" / "softmax" / name, work / name)
        task = work / "cpu_naive.py"
        if session.server.runs_jobs:
            session.open(task.as_uri(), "python", task.read_text())
            command = {
                "command": "htam.optimize",
                "arguments": [{"uri": task.as_uri(), "steps": 8}],
            }
            answer = await session.client.request("workspace/executeCommand", command)
            load = Load(f"{STEP_LABEL}, started through the server", job=answer["jobId"])
        else:
            argv = optimize_argv(
                str(task),
                str(task),
                8,
                Settings(provider="offline", device="cpu"),
                0,
                str(work / f"run-{session.server.name}"),
            )
            proc = subprocess.Popen(
                argv,
                env=session.server.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            load = Load(f"{STEP_LABEL}, the same command as a subprocess", proc=proc)
        await asyncio.sleep(5)  # past the worker's start-up, into compiling and timing
        if load.running(session):
            return load
        await load.stop(session)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    return Load("a CPU-busy subprocess", proc=burner)


async def measure_server(
    server: Server, texts: dict[tuple[int, str], str], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Every file this server reads: idle, after edits, then while a step runs."""
    rng = random.Random(args.seed)  # the same positions for every server
    session = Session(server, OPTIONS)
    await session.start()
    files: dict[str, Any] = {}
    opened = {}
    for (size, kind), text in texts.items():
        if kind not in server.kinds:
            continue
        uri = (work / f"bench_{size}.{kind}").as_uri()
        start = time.perf_counter()
        session.open(uri, "cuda" if kind == "cu" else "python", text)
        first = await session.client.request(
            "textDocument/documentSymbol", {"textDocument": {"uri": uri}}
        )
        files[f"{size}.{kind}"] = {
            "lines": text.count("\n"),
            "symbols": _count(first),
            "open_to_first_symbols_ms": (time.perf_counter() - start) * 1000,
            "idle": await measure_file(session, uri, text, args.requests, rng, args.budget),
            "hover_after_edit": await hover_after_edit(
                session, uri, text, max(args.requests // 4, 5), rng, args.budget
            ),
        }
        opened[f"{size}.{kind}"] = (uri, text)
    load = await start_load(session, work, args.quick)
    for name, (uri, text) in opened.items():
        files[name]["during_step"] = await measure_file(
            session, uri, text, args.requests, rng, args.budget
        )
    running = load.running(session)
    await load.stop(session)
    await session.stop()
    return {
        "command": list(server.argv),
        "load": load.label,
        "step_running_throughout": running,
        "files": files,
    }


async def startup(arms: list[Server], repeats: int = 3) -> dict[str, Any]:
    """Start-up of each server and the import floors, interleaved so they share conditions."""
    times: dict[str, list[float]] = {a.name: [] for a in arms}
    floors: dict[str, list[float]] = {m: [] for m in ("lsprotocol.types", "pygls.lsp.server")}
    for _ in range(repeats):
        for module, samples in floors.items():
            samples.append(import_time(module))
        for arm in arms:
            session = Session(arm, OPTIONS)
            times[arm.name].append(await session.start())
            await session.stop()
    return {
        "servers_s": {name: statistics.median(s) for name, s in times.items()},
        "import_s": {module: statistics.median(s) for module, s in floors.items()},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="htam-bench-lsp-"))
    work = home / "files"
    work.mkdir()
    arms = servers(args, home)
    texts = {
        (size, kind): make(size)
        for size in args.sizes
        for kind, make in (("cu", cuda_source), ("py", python_source))
    }
    result: dict[str, Any] = {"seed": args.seed, "requests": args.requests}
    result["startup"] = await startup(arms)
    result["servers"] = {arm.name: await measure_server(arm, texts, work, args) for arm in arms}
    shutil.rmtree(home, ignore_errors=True)
    return result


def _count(symbols: list[dict[str, Any]] | None) -> int:
    return sum(1 + _count(s.get("children")) for s in symbols or [])


def _cell(stats: dict[str, float] | None, requests: int) -> str:
    if not stats:
        return "-"
    fewer = f" (n={stats['n']:.0f})" if stats["n"] < requests else ""
    return f"{stats['p50_ms']:.1f} / {stats['p99_ms']:.1f}{fewer}"


def markdown(result: dict[str, Any]) -> str:
    names = list(result["servers"])
    ours, base = names[0], next((n for n in names if n.startswith("htam-lsp@")), None)
    up = result["startup"]
    lines = [
        "Start-up, spawn to initialize answered (median of 3): "
        + ", ".join(f"{n} {s * 1000:.0f} ms" for n, s in up["servers_s"].items())
        + "; floors: "
        + ", ".join(f"`import {m}` {s * 1000:.0f} ms" for m, s in up["import_s"].items())
        + ".",
        "",
    ]
    lines += [
        f"- {n}: while a step runs = {d['load']} (still running at the end: "
        f"{d['step_running_throughout']})"
        for n, d in result["servers"].items()
    ]
    ratio = f" | p99 {base} / {ours}" if base else ""
    lines += [
        "",
        "Round trip p50 / p99 in ms (jedi-language-server reads only the `.py` files).",
        "",
        "| file | request | condition | " + " | ".join(names) + ratio + " |",
        "|---|---|---|" + "---:|" * (len(names) + bool(base)),
    ]
    for file, data in result["servers"][ours]["files"].items():
        for request in REQUESTS:
            for condition in ("idle", "during_step"):
                cells = [
                    _cell(
                        result["servers"][n]["files"].get(file, {}).get(condition, {}).get(request),
                        result["requests"],
                    )
                    for n in names
                ]
                extra = ""
                if base:
                    before = result["servers"][base]["files"][file][condition][request]["p99_ms"]
                    extra = f" | {before / data[condition][request]['p99_ms']:.1f}x"
                lines.append(
                    f"| {file} | {request} | {condition} | " + " | ".join(cells) + extra + " |"
                )
    lines += [
        "",
        "| file | server | lines | symbols | first symbols after open | edit + hover p50 / p99 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for file in result["servers"][ours]["files"]:
        for n in names:
            d = result["servers"][n]["files"].get(file)
            if d:
                edit = _cell(d["hover_after_edit"], max(result["requests"] // 4, 5))
                lines.append(
                    f"| {file} | {n} | {d['lines']} | {d['symbols']} "
                    f"| {d['open_to_first_symbols_ms']:.0f} ms | {edit} |"
                )
    five = [d for d in result["servers"][ours]["files"].values() if 4000 <= d["lines"] <= 6000]
    worst = max(
        (d[c][r]["p99_ms"] for d in five for c in ("idle", "during_step") for r in REQUESTS),
        default=None,
    )
    if worst is not None:
        verdict = "met" if worst < TARGET_MS else "NOT met"
        lines += [
            "",
            f"Target p99 < {TARGET_MS:.0f} ms on 5,000 lines ({ours}): {verdict} "
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
    parser.add_argument(
        "--no-reference", action="store_true", help="leave jedi-language-server out"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=15.0,
        help="seconds per file, request kind and condition before a slow server gets fewer "
        f"requests (at least {MIN_SAMPLES})",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout whose htam-lsp is measured too (before/after)",
    )
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
