"""Lifecycle: nothing a candidate starts outlives its evaluation, killing the caller
leaves no process and no job folder, and a stopped worker really stops."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.candidates import sandboxed

from htam_engine.evaluate import Limits, reaper
from htam_engine.evaluate.jobfolder import clean_stale_jobs
from htam_engine.evaluate.process import Child, freeze, thaw
from htam_engine.evaluate.runner import run_candidate
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Verdict
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures"
QUICK = Limits(compile_s=60, verify_s=30, time_s=60)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line names `text` (a job folder lies under it)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_setsid_daemon_does_not_outlive_the_evaluation(htam_home):
    path = FIXTURES / "candidates" / "adversarial" / "daemon.py"
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    run_candidate(load_task(path), path.read_text(), verdict, QUICK, threading.Event(), print)
    assert verdict.correct, verdict.error
    assert wait_until(lambda: not processes_mentioning(str(htam_home)), 5)
    assert not any((htam_home / "jobs").iterdir())


def test_a_chain_of_forks_does_not_outlive_the_evaluation(htam_home, monkeypatch):
    """Without the PID namespace bwrap gives (its death takes every process in it)."""
    path = FIXTURES / "candidates" / "adversarial" / "fork_chain.py"
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    with sandboxed("none", monkeypatch):
        run_candidate(load_task(path), path.read_text(), verdict, QUICK, threading.Event(), print)
    assert wait_until(lambda: not processes_mentioning(str(htam_home)), 5), processes_mentioning(
        str(htam_home)
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_killing_htam_eval_leaves_no_process_and_no_job_folder(htam_home, signum):
    task = FIXTURES / "eval" / "hang.py"
    command = [sys.executable, "-m", "htam_engine.cli", "eval", str(task), str(task), "--no-cache"]
    caller = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers = lambda: [p for p in processes_mentioning(str(htam_home)) if p != caller.pid]  # noqa: E731
    jobs = lambda: processes_mentioning(str(htam_home / "jobs"))  # noqa: E731
    try:  # the judge (it sizes the problem first), both reapers and their workers
        assert wait_until(lambda: len(jobs()) >= 5, 90), "the evaluation never started"
        time.sleep(1.0)  # the candidate is now inside its hanging call
        caller.send_signal(signum)
        caller.wait(10)
        assert wait_until(lambda: not workers(), 10), processes_mentioning(str(htam_home))
        assert wait_until(lambda: not any((htam_home / "jobs").iterdir()), 10)
    finally:
        caller.kill()
        caller.wait()


DYING_JUDGE = """
import signal, sys, types
from pathlib import Path
from htam_engine.evaluate.judge import _die_cleanly
from htam_engine.evaluate.process import Child
jobdir = Path(sys.argv[1])
argv = [sys.executable, "-c", "input()", str(jobdir)]
worker = Child("candidate", argv, jobdir, {}, jobdir / "log")
sides = {"candidate": types.SimpleNamespace(child=worker)}
signal.signal(signal.SIGTERM, lambda *_: _die_cleanly(jobdir, sides))
print("waiting", flush=True)
worker.popen.wait()  # as when a worker's death is read: the Popen's lock is held
"""


def test_a_judge_told_to_die_while_it_reaps_a_worker_still_dies(tmp_path):
    """The caller's death reaches the judge as SIGTERM at any moment, here inside
    `Popen.wait`, whose lock a handler that reaped would wait for forever."""
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    script = tmp_path / "judge.py"
    script.write_text(DYING_JUDGE)
    judge = subprocess.Popen(
        [sys.executable, str(script), str(jobdir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert judge.stdout is not None
        assert judge.stdout.readline() == "waiting\n"
        time.sleep(0.3)  # inside wait()
        judge.send_signal(signal.SIGTERM)
        assert judge.wait(10) == 1
        assert wait_until(lambda: not processes_mentioning(str(jobdir)), 5)
        assert not jobdir.exists()
    finally:
        judge.kill()
        judge.wait()


def test_stale_job_folders_are_removed_and_live_ones_kept(htam_home):
    jobs = htam_home / "jobs"
    stale = jobs / "eval-dead"
    stale.mkdir(parents=True)
    (stale / ".owner").touch()  # its owner died: nobody holds the lock
    assert clean_stale_jobs() == 1 and not stale.exists()


def test_a_frozen_worker_burns_no_cpu(tmp_path):
    burn = "import sys\nsys.stdin.readline()\nwhile True: pass\n"
    script = tmp_path / "burn.py"
    script.write_text(burn)
    child = Child("burner", [sys.executable, str(script)], tmp_path, {}, tmp_path / "log")
    try:
        child.send("start")

        def cpu_ticks() -> int:
            fields = Path(f"/proc/{child.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])

        time.sleep(0.3)
        freeze(child)
        frozen = cpu_ticks()
        time.sleep(0.5)
        assert cpu_ticks() == frozen
        thaw(child)
        assert wait_until(lambda: cpu_ticks() > frozen, 2)
    finally:
        child.kill()


def test_a_candidate_that_hangs_when_timed_holds_the_lock_only_seconds():
    path = FIXTURES / "candidates" / "adversarial" / "hang_when_timed.py"
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    run_candidate(load_task(path), path.read_text(), verdict, QUICK, threading.Event(), print)
    assert verdict.error is not None and verdict.error.kind == "timeout", verdict.error
    assert verdict.phase_seconds["time"] < QUICK.time_s / 6  # not the phase limit (60 s)


def test_without_bwrap_the_fallback_runs_and_says_so(monkeypatch):
    monkeypatch.setenv("HTAM_SANDBOX", "none")
    sandbox_mode.cache_clear()
    try:
        path = FIXTURES / "candidates" / "honest" / "plain.py"
        verdict = Verdict(device="cpu", sandbox=sandbox_mode())
        run_candidate(load_task(path), path.read_text(), verdict, QUICK, threading.Event(), print)
    finally:
        sandbox_mode.cache_clear()
    assert verdict.correct, verdict.error
    assert verdict.sandbox == "none"


def test_the_timing_lock_is_machine_wide_not_per_htam_home():
    """Another HTAM home's evaluation holds the device: this one verifies, then waits."""
    from htam_engine.evaluate import evaluate
    from htam_engine.evaluate.process import timing_lock

    path = FIXTURES / "candidates" / "honest" / "plain.py"
    timing = threading.Event()
    result: list[Verdict] = []

    def on_phase(phase: str) -> None:
        if phase == "time":
            timing.set()

    def run() -> None:
        task = load_task(path)
        result.append(evaluate(task, path.read_text(), device="cpu", limits=QUICK,
                               use_cache=False, on_phase=on_phase))  # fmt: skip

    with timing_lock("cpu"):
        worker = threading.Thread(target=run)
        worker.start()
        assert timing.wait(60), "never got to timing"
        worker.join(2.0)
        assert worker.is_alive()  # waiting for the lock this process holds
    worker.join(60)
    assert result and result[0].correct, result


GROW = "import time\nheld = bytearray({mb} << 20)\ntime.sleep(0.3)"


@pytest.mark.parametrize("forked", [False, True])
def test_a_tree_past_its_resident_cap_is_stopped_whole(forked):
    """The reaper holds a command's whole tree to its memory cap together: one process,
    or two that each stay under the cap (an address-space cap is per process)."""
    grow = GROW.format(mb=120)
    code = f"import os\nos.fork()\n{grow}" if forked else GROW.format(mb=240)
    argv = [sys.executable, "-I", "-S", reaper.__file__, "64", "200", "--", sys.executable, "-c"]
    assert subprocess.run([*argv, code], timeout=60).returncode == reaper.OVER_MEMORY
    assert subprocess.run([*argv, GROW.format(mb=50)], timeout=60).returncode == 0


def test_a_sandbox_whose_reaper_is_gone_dies_with_its_job_folder(tmp_path):
    """A bwrap left waiting in its PID namespace with parent 1 ignores SIGTERM (the
    namespace's init): the job's end kills whatever names its folder."""
    from htam_engine import procs

    box = tmp_path / "job-xyz" / "candidate"
    box.mkdir(parents=True)
    argv = [sys.executable, "-c", "import time; time.sleep(600)", str(box)]
    if shutil.which("bwrap"):
        argv = ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--bind", str(box), str(box)]
        argv += ["--", sys.executable, "-c", "import time; time.sleep(600)", str(box)]
    left = subprocess.Popen(argv, start_new_session=True)
    try:
        assert wait_until(lambda: procs.naming(str(box)), 10)
        procs.kill_naming(str(box.parent))
        assert not procs.naming(str(box.parent))
    finally:
        left.kill()
        left.wait()
