"""`htam.status`: what this server can do on this machine, and why, as data.

VS Code's status bar and Neovim's `:checkhealth htam` both show this answer instead of
re-deriving it. The probes that start a process (the GPU's name, the evaluator's sandbox
mode) run once, as subprocesses, so that the server never imports the evaluator.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from typing import TYPE_CHECKING, Any

from htam_engine import __version__, machine, roofline
from htam_lsp.llm_provider import provider

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

log = logging.getLogger(__name__)

COMPILERS = ("nvcc", "g++")
PROBE_S = 30.0
SANDBOX_PROBE = "from htam_engine.evaluate.sandbox import sandbox_mode; print(sandbox_mode())"
_probed: dict[str, str | None] = {}


async def report(ls: HtamServer) -> dict[str, Any]:
    """The `htam.status` answer (docs/ARCHITECTURE.md, "Server protocol")."""
    name, why = provider(ls)
    gpu = machine.gpu_present()
    return {
        "version": __version__,
        "provider": {"name": name, "why": why},
        "gpu": {"present": gpu, "name": await _gpu_name() if gpu else None},
        "device": _device(ls.settings.device, gpu),
        "compilers": {c: shutil.which(c) for c in COMPILERS},
        "sandbox": await _sandbox(),
        "machine": machine_limits(),
        "execution": {"allowed": ls.settings.allow_execution, "howToAllow": how_to_allow(ls)},
        "settings": ls.settings.to_json(),
        "problems": [f"{where}: {p}" for where, found in ls.problems.items() for p in found],
    }


def machine_limits() -> dict[str, Any]:
    """This machine's measured limits as kept for every HTAM home (never measured here: a
    measurement takes a minute): a one-line summary, each round's numbers, where kept."""
    limits = roofline.cached_limits()
    where = str(roofline.cached_path())
    if limits is None:
        return {
            "measured": False,
            "summary": "not measured yet: the first timed step measures it (or `htam machine`)",
            "path": where,
        }
    return {
        "measured": True,
        "summary": roofline.summary(limits),
        "stable": limits.stable,
        "rounds": limits.rounds,
        "measuredAt": limits.measured_at,
        "fingerprint": limits.fingerprint,
        "path": where,
    }


def _device(setting: str, gpu: bool) -> dict[str, str]:
    if setting != "auto":
        return {"name": setting, "why": f"the device setting is {setting}"}
    if gpu:
        return {"name": "cuda", "why": "auto: an NVIDIA GPU is present"}
    return {"name": "cpu", "why": "auto: no NVIDIA GPU here; CUDA kernels cannot run"}


def client_kind(ls: HtamServer) -> str:
    """ "neovim", "vscode" or "other", from the client's `clientInfo.name`."""
    name = (getattr(ls, "client_name", "") or "").lower()
    if "neovim" in name or "nvim" in name:
        return "neovim"
    return "vscode" if "code" in name else "other"


def how_to_allow(ls: HtamServer) -> str:
    """How the user of this client allows execution, in the client's own terms."""
    return {
        "neovim": "require('htam').setup({ allow_execution = true })",
        "vscode": "trust the workspace (Workspaces: Manage Workspace Trust)",
    }.get(client_kind(ls), "start htam-lsp with initializationOptions { allowExecution: true }")


def how_to_let_a_model_try(ls: HtamServer) -> str:
    """How the user of this client gives HTAM an LLM, in the client's own terms."""
    return {
        "neovim": (
            "set ANTHROPIC_API_KEY or OPENAI_API_KEY in Neovim's environment, or "
            "require('htam').setup({ provider = 'openai', base_url = ... }) for a local server"
        ),
        "vscode": (
            "run 'HTAM: Set API Key...', or set htam.provider and htam.baseUrl for an "
            "OpenAI-compatible server"
        ),
    }.get(client_kind(ls), "set ANTHROPIC_API_KEY or OPENAI_API_KEY for htam-lsp")


def how_to_check(ls: HtamServer) -> str:
    """How the user of this client runs the nvcc compile check."""
    return {
        "neovim": ":HtamCheck",
        "vscode": "HTAM: Compile-Check with nvcc",
    }.get(client_kind(ls), "the htam.compileCheck command")


async def _gpu_name() -> str | None:
    if "gpu" not in _probed:
        tool = shutil.which("nvidia-smi")
        lines = (await _output([tool, "-L"])).splitlines() if tool else []
        _probed["gpu"] = lines[0].strip() if lines else None
    return _probed["gpu"]


async def _sandbox() -> dict[str, str]:
    """How candidates are isolated: the evaluator's own answer ("bwrap" or "none")."""
    if "sandbox" not in _probed:
        _probed["sandbox"] = (await _output([sys.executable, "-c", SANDBOX_PROBE])).strip()
    mode = _probed["sandbox"] or "unknown"
    why = {
        "bwrap": "candidates run in a bubblewrap sandbox",
        "none": "no bubblewrap here: candidates run as plain isolated processes",
    }
    return {"mode": mode, "why": why.get(mode, "the evaluator did not say")}


async def _output(argv: list[str]) -> str:
    """The stdout of a short probe; '' when it fails or takes too long."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as error:
        log.info("probe %s failed: %s", argv[:2], error)
        return ""
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), PROBE_S)
    except TimeoutError:
        proc.kill()
        log.info("probe %s took over %s s", argv[:2], PROBE_S)
        return ""
    return out.decode("utf-8", "replace") if proc.returncode == 0 else ""
