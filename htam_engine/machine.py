"""Facts about this machine, decided in one place: which device a run uses, whether a GPU
is present, which environment a child process gets, and how a process group is killed.

The language server and the engine both ask here, so the server never starts a job the
engine then stops for want of a GPU. Dependency-free (no torch, no subprocess) and cheap:
the server asks on every code action.

`gpu_present()` reads `HTAM_FORCE_GPU` first: `1` says there is a GPU, `0` that there is
none, whatever the driver says (unset or anything else: the driver decides). Tests set it
(`monkeypatch.setenv`) to run both branches on any machine; child processes inherit it,
so a server and the engine it starts agree.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

from htam_engine.errors import UserError
from htam_engine.vocabulary import DEVICES, Device

AUTO = "auto"
DEVICE_CHOICES: tuple[str, ...] = (AUTO, *DEVICES)  # what --device and htam.device accept
FORCE_GPU_ENV = "HTAM_FORCE_GPU"
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver manages

# Variables a compiler or a CUDA runtime needs: all a sandboxed worker gets of the caller's
# environment (the sandbox adds its own home, caches and thread counts).
WORKER_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "CC",
    "CXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "MAX_JOBS",
)
# What HTAM's own trusted children (the judge, the roofline's count that imports a reference
# outside the sandbox) need besides: where Python finds HTAM, where HTAM keeps its data,
# temporary space, and the settings of torch, Triton, the CUDA libraries and coverage.
TRUSTED_ENV = (
    *WORKER_ENV,
    "HOME",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "TZ",
    "TERM",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HTAM_HOME",
    "HTAM_BUILD_DIR",
    "HTAM_SANDBOX",
    FORCE_GPU_ENV,
)
TRUSTED_PREFIXES = (
    "LC_",
    "XDG_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "KMP_",
    "COV_CORE_",
    "COVERAGE_",
)
# A name that looks like a credential never passes, even when a prefix above admits it.
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)


def gpu_present() -> bool:
    """True when the NVIDIA driver lists a GPU (no torch, no subprocess), unless
    `HTAM_FORCE_GPU` is `1` (True) or `0` (False)."""
    forced = os.environ.get(FORCE_GPU_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir())


def resolve_device(device: str, backend: str) -> Device:
    """The device a kernel of `backend` runs on for `device` ("auto": a CUDA kernel on
    cuda, anything else on cpu); `UserError` for a device HTAM does not know."""
    if device == AUTO:
        return "cuda" if backend == "cuda" else "cpu"
    for known in DEVICES:
        if device == known:
            return known
    raise UserError(f"unknown device {device!r}: use one of {', '.join(DEVICE_CHOICES)}")


def scrubbed_env(
    names: Iterable[str] = WORKER_ENV,
    prefixes: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables of `environ` (default: this process's) that are in `names` or start
    with one of `prefixes`, never one named like a key, token or password."""
    source = os.environ if environ is None else environ
    allowed = frozenset(names)
    return {
        name: value
        for name, value in source.items()
        if (name in allowed or name.startswith(prefixes)) and not _SECRET.search(name)
    }


def trusted_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a trusted child of HTAM's own (the judge, the roofline's count):
    what it needs to find HTAM, its data and the GPU libraries, and no credentials."""
    return scrubbed_env(TRUSTED_ENV, TRUSTED_PREFIXES, environ)


def kill_process_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to process group `pgid`; False when it had gone or is not ours to signal.
    Takes no lock and reaps nothing, so a signal handler may call it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- what a kernel engineer asks about the machine first ------------------------------

from dataclasses import dataclass  # noqa: E402 - this section's own imports
from functools import cache  # noqa: E402

ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd", "sve",
)  # fmt: skip
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
GPU_QUERY = "name,compute_cap,memory.total,clocks.max.sm,clocks.max.memory"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo."""
    found: dict[str, str] = {}
    for line in _read(Path("/proc/cpuinfo")).splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        found.setdefault(key.strip(), value.strip())
    return found


def _caches() -> list[str]:
    """e.g. ["L1d 48K", "L2 2048K", "L3 32768K"] from sysfs (per core, L3 shared)."""
    sizes = []
    for index in sorted(CPU_CACHES.glob("index*")):
        kind = _read(index / "type")
        if kind == "Instruction":
            continue
        level = _read(index / "level")
        suffix = "d" if kind == "Data" else ""
        sizes.append(f"L{level}{suffix} {_read(index / 'size')}")
    return sizes


def _gpus() -> list[dict[str, str]]:
    """One dict per NVIDIA GPU from nvidia-smi (name, SM, memory, clocks); [] without one."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not gpu_present() or smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    keys = GPU_QUERY.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in done.stdout.splitlines()
        if line.strip()
    ]


# The core generation behind a CPU a virtual machine may name only "AMD EPYC": what a
# kernel writer tunes for (how wide the vector units really are). AMD by family (and
# AVX-512, which splits family 19h); Intel server cores by family 6 model.
_AMD_CORES = {
    0x17: "Zen / Zen 2 (AMD family 17h): two 256-bit FMA pipes (Zen: 128-bit halves)",
    0x1A: "Zen 5 (AMD family 1Ah): a full 512-bit datapath on server and desktop parts",
}
_ZEN3 = "Zen 3 (AMD family 19h): two 256-bit FMA pipes, no AVX-512"
_ZEN4 = (
    "Zen 4 (AMD family 19h): 512-bit instructions run as two 256-bit halves, so AVX-512 "
    "FMAs peak at AVX2's FLOP rate; its 32 vector registers and masks still help"
)
_INTEL_CORES = {
    0x55: "Skylake-SP / Cascade Lake (Intel): one or two 512-bit FMA units by SKU",
    0x6A: "Ice Lake-SP (Intel): two 512-bit FMA units",
    0x6C: "Ice Lake-SP (Intel): two 512-bit FMA units",
    0x8F: "Sapphire Rapids (Intel): two 512-bit FMA units, AMX",
    0xCF: "Emerald Rapids (Intel): two 512-bit FMA units, AMX",
    0xAD: "Granite Rapids (Intel): two 512-bit FMA units, AMX",
    0xAE: "Granite Rapids (Intel): two 512-bit FMA units, AMX",
}


def core_generation(info: dict[str, str], flags: set[str]) -> str:
    """The core generation from /proc/cpuinfo's vendor, family and model ("" unknown)."""
    try:
        family, model = int(info.get("cpu family", "")), int(info.get("model", ""))
    except ValueError:
        return ""
    vendor = info.get("vendor_id", "")
    if vendor == "AuthenticAMD" and family == 0x19:
        return _ZEN4 if "avx512f" in flags else _ZEN3
    if vendor == "AuthenticAMD":
        return _AMD_CORES.get(family, "")
    if vendor == "GenuineIntel" and family == 6:
        return _INTEL_CORES.get(model, "")
    return ""


@dataclass(frozen=True)
class MachineFacts:
    cpu: str
    isa: list[str]  # the ISA_FLAGS the CPU has
    cores: int  # cores this process may run on
    caches: list[str]
    gpus: list[dict[str, str]]  # GPU_QUERY's keys: name, SM, memory (MiB), clocks (MHz)
    core: str = ""  # `core_generation`: "" where not known


@cache
def cpu_facts() -> MachineFacts:
    """The machine as a prompt states it: CPU model, ISA flags, cores, cache sizes, and
    each GPU's name, SM (compute capability), memory and max clocks. Read once per
    process (sysfs, /proc; nvidia-smi only where a GPU is present)."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return MachineFacts(
        cpu=info.get("model name") or info.get("Processor") or "unknown CPU",
        isa=[f for f in ISA_FLAGS if f in flags],
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        caches=_caches(),
        gpus=_gpus(),
        core=core_generation(info, flags),
    )
