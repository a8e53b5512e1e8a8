"""The machine facts every part asks (`htam_engine.machine`): the GPU's presence and its
override, "auto" resolved, the environment a child gets, a process group killed."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from htam_engine import machine
from htam_engine.errors import UserError
from htam_engine.evaluate import sandbox
from htam_engine.vocabulary import DEVICES

SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-must-not-leak",
    "AWS_SECRET_ACCESS_KEY": "aws-must-not-leak",
    "OPENAI_API_KEY": "sk-must-not-leak",
    "GITHUB_TOKEN": "ghp-must-not-leak",
    "HTAM_PROVIDER_TOKEN": "htam-must-not-leak",
    "TORCH_HUB_TOKEN": "a prefix the trusted list admits, a name it refuses",
    "DB_PASSWORD": "hunter2",
}


@pytest.mark.parametrize(("forced", "present"), [("1", True), ("0", False)])
def test_the_override_decides_both_branches(monkeypatch, tmp_path, forced, present):
    monkeypatch.setattr(machine, "NVIDIA_GPUS", tmp_path / "absent")
    monkeypatch.setenv(machine.FORCE_GPU_ENV, forced)
    assert machine.gpu_present() is present


def test_without_the_override_the_driver_decides(monkeypatch, tmp_path):
    monkeypatch.delenv(machine.FORCE_GPU_ENV, raising=False)
    gpus = tmp_path / "gpus"
    monkeypatch.setattr(machine, "NVIDIA_GPUS", gpus)
    assert machine.gpu_present() is False  # no driver folder
    gpus.mkdir()
    assert machine.gpu_present() is False  # a driver that manages no GPU
    (gpus / "0000:01:00.0").mkdir()
    assert machine.gpu_present() is True
    monkeypatch.setenv(machine.FORCE_GPU_ENV, "yes")  # not 0 or 1: ignored
    assert machine.gpu_present() is True


def test_the_engine_and_the_server_ask_the_same_function(monkeypatch):
    """The server cannot offer a CUDA run the engine then stops as no GPU."""
    from htam_engine.evaluate import runner
    from htam_lsp import code_actions, runs, status

    for module in (runner, code_actions, runs, status):
        assert module.machine.gpu_present is machine.gpu_present


def test_auto_resolves_by_the_kernel_and_the_rest_is_checked():
    assert machine.resolve_device("auto", "cuda") == "cuda"
    assert machine.resolve_device("auto", "cpu") == "cpu"
    assert machine.resolve_device("auto", "triton") == "cpu"
    for device in DEVICES:
        assert machine.resolve_device(device, "cuda") == device
    with pytest.raises(UserError, match="use one of auto, cuda, cpu"):
        machine.resolve_device("tpu", "cuda")
    assert machine.DEVICE_CHOICES[1:] == DEVICES


def _device_choices(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """The choices of every --device option of `parser` and of its subcommands."""
    found = []
    for action in parser._actions:
        if "--device" in action.option_strings:
            found.append(tuple(action.choices or ()))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _device_choices(sub)
    return found


def test_every_device_list_is_the_vocabulary():
    from htam_engine.cli import build_parser
    from htam_lsp.settings import Settings

    found = _device_choices(build_parser())
    assert len(found) >= 3 and set(found) == {machine.DEVICE_CHOICES}  # eval, optimize, bench
    settings, problems = Settings().merged({"device": "tpu"}, may_allow=False)
    assert problems == ["htam.device: 'tpu' is not one of auto, cuda, cpu"]
    assert settings.device == "auto"


def test_no_secret_passes_either_scrubber():
    environ = {**SECRETS, "PATH": "/usr/bin", "CUDA_HOME": "/usr/local/cuda", "EDITOR": "vi"}
    worker = machine.scrubbed_env(environ=environ)
    trusted = machine.trusted_env(environ)
    for env in (worker, trusted):
        assert not set(SECRETS) & set(env), env
        assert env["PATH"] == "/usr/bin" and env["CUDA_HOME"] == "/usr/local/cuda"
        assert "EDITOR" not in env  # an allowlist: what is not named is dropped
    assert set(worker) <= set(machine.WORKER_ENV)


def test_the_trusted_env_keeps_what_the_judge_needs():
    environ = {
        "HOME": "/home/u",
        "PYTHONPATH": "/src",
        "HTAM_BUILD_DIR": "/build",
        "HTAM_SANDBOX": "none",
        "HTAM_LLM_BASE_URL": "http://proxy",  # HTAM's, but no child of the evaluator's
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "LC_NUMERIC": "C",
    }
    trusted = machine.trusted_env(environ)
    assert trusted == {k: v for k, v in environ.items() if k != "HTAM_LLM_BASE_URL"}
    worker = machine.scrubbed_env(environ=environ)
    assert worker == {}  # a worker gets none of these: the sandbox sets its own home


def test_a_worker_environment_is_the_allowlist_and_the_sandbox_own(monkeypatch, tmp_path):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    env = sandbox.environment(tmp_path, threads=1)
    assert not set(SECRETS) & set(env)
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == str(tmp_path)
    assert not [name for name in env if name.startswith("HTAM_")]


def test_the_judge_gets_the_trusted_env(monkeypatch):
    from htam_engine.evaluate import jobfolder

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    env = jobfolder.judge_env()
    assert not set(SECRETS) & set(env)
    assert env["HTAM_HOME"] == os.environ["HTAM_HOME"] and env["PATH"] == os.environ["PATH"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_killer_kills_a_whole_process_group(tmp_path):
    """A leader and the child it forked, in a group of their own: both die."""
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; wait"
    leader = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (pids.exists() and pids.read_text().strip()):
            assert time.monotonic() < deadline, "the group never started its child"
            time.sleep(0.01)
        child = int(pids.read_text())
        assert os.getpgid(child) == leader.pid
        assert machine.kill_process_group(leader.pid) is True
        assert leader.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _alive(child):  # reparented and reaped, or a zombie: dead either way
            assert time.monotonic() < deadline, "the group's child survived"
            time.sleep(0.01)
    finally:
        machine.kill_process_group(leader.pid)
        leader.wait()


def test_the_killer_says_false_for_a_group_that_has_gone():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    assert machine.kill_process_group(proc.pid, signal.SIGTERM) is True
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert machine.kill_process_group(proc.pid) is False  # reaped: no such group


def test_the_killer_tolerates_a_group_it_may_not_signal(monkeypatch):
    def refused(pgid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "killpg", refused)
    assert machine.kill_process_group(12345) is False
