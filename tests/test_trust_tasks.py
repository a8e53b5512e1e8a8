"""Every task a worker creates is tracked from outside (its reaper is a subreaper, with
or without bwrap): stopped between calls, charged, seen running, killed at the end; and
the thread and core policy is checked from /proc (`timing.threads`)."""

import os
import time
from pathlib import Path

import pytest
from helpers.candidates import CANDIDATES, MODES, failed, measure, sandboxed

from htam_engine.evaluate import tasks
from htam_engine.evaluate.runner import timing_threads
from htam_engine.evaluate.sandbox import MAX_PROCESSES
from htam_engine.procs import ancestors


def _left(home: Path) -> list[int]:
    """Live processes started for an evaluation under `home` (a worker, or a helper it
    forked: its command line names the job folder)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(home).encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["double_fork_burner", "widen_affinity", "static_init_thread"])
def test_work_outside_the_policy_is_cheating_by_timing_threads(name, mode, monkeypatch, htam_home):
    with sandboxed(mode, monkeypatch):
        verdict = measure(CANDIDATES / "adversarial" / f"{name}.py")
    assert verdict.error is not None and verdict.error.kind == "cheating", verdict.error
    assert "timing.threads" in failed(verdict), verdict.checks
    assert "timing.threads" in verdict.error.message
    deadline = time.monotonic() + 5
    while _left(htam_home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _left(htam_home), "a helper outlived its evaluation"


@pytest.mark.parametrize("mode", MODES)
def test_an_honest_openmp_kernel_runs_with_the_policys_threads(mode, monkeypatch):
    with sandboxed(mode, monkeypatch):
        verdict = measure(CANDIDATES / "honest" / "openmp.py")
    assert verdict.correct and verdict.error is None, verdict.error
    assert verdict.threads == timing_threads()
    assert verdict.spread["threads_seen"] == timing_threads()
    assert verdict.spread["cores_seen"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_candidate_past_the_process_cap_is_stopped_with_its_tree(mode, monkeypatch, htam_home):
    with sandboxed(mode, monkeypatch):
        verdict = measure(CANDIDATES / "adversarial" / "many_processes.py")
    assert verdict.error is not None and verdict.error.kind == "crash", verdict.error
    assert f"over {MAX_PROCESSES} processes" in verdict.error.message
    deadline = time.monotonic() + 10
    while _left(htam_home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _left(htam_home), "processes outlived the cap's kill"


def test_the_sandboxs_own_processes_do_not_count_as_the_candidates_threads() -> None:
    """bwrap above the worker wakes when the worker is stopped and continued around a
    call (0.7 ms of a 3 ms call was seen under load): it is not one of the candidate's
    threads; a second task of the worker's own is, and every task's affinity counts."""
    bwrap, worker = 100, 200
    before = tasks.Snapshot({}, {}, {})
    after = tasks.Snapshot(
        {
            bwrap: tasks.Books(700_000, 0, frozenset({1})),
            worker: tasks.Books(2_800_000, 0, frozenset({1})),
        },
        {bwrap: 700_000, worker: 2_800_000},
        {bwrap: bwrap, worker: worker},
    )
    calm = tasks.observe(before, after, core=1, wall_s=0.003, sandbox=frozenset({bwrap}))
    assert calm.running == 1 and not calm.widened
    assert tasks.observe(before, after, core=1, wall_s=0.003).running == 2
    wide = tasks.Snapshot(
        {**after.tasks, bwrap: tasks.Books(0, 0, frozenset({0, 1}))}, {}, after.owners
    )
    assert tasks.observe(before, wide, core=1, wall_s=0.003, sandbox=frozenset({bwrap})).widened


def test_a_count_seen_only_in_the_busiest_tenth_of_the_calls_is_tolerated() -> None:
    assert tasks.threads_seen([1] * 19 + [2]) == 1  # one call in twenty
    assert tasks.threads_seen([1] * 18 + [2, 2]) == 1  # two in twenty: the tenth
    assert tasks.threads_seen([1] * 17 + [2, 2, 3]) == 2  # three in twenty
    assert tasks.threads_seen([1] * 8 + [2]) == 2  # under ten calls: none tolerated
    assert tasks.threads_seen([]) == 0


def test_a_task_held_up_in_a_call_counts_by_its_demand_and_says_so() -> None:
    """A woken thread queued behind a neighbour ran nothing and still counts for that call
    (a spinner on the pinned core may only queue): the names say which it was."""
    main, woken = 200, 201
    before = tasks.Snapshot({woken: tasks.Books(1_000_000, 0, frozenset({1}))}, {}, {})
    after = tasks.Snapshot(
        {
            main: tasks.Books(50_000_000, 0, frozenset({1})),
            woken: tasks.Books(1_100_000, 4_700_000, frozenset({1})),
        },
        {},
        {main: main, woken: main},
    )
    seen = tasks.observe(before, after, core=1, wall_s=0.055)
    assert seen.running == 2
    assert any("ran 0.1 ms, queued 4.7 ms" in name for name in seen.names), seen.names


def test_over_the_policy_in_most_calls_is_a_task_of_its_own() -> None:
    assert tasks.over_policy([1, 2, 1, 1, 2, 1], allowed=1) == ([1, 4], False)
    assert tasks.over_policy([2, 2, 1, 2], allowed=1) == ([0, 1, 3], True)
    assert tasks.over_policy([2, 1], allowed=1) == ([0], False)  # half is not most
    assert tasks.over_policy([], allowed=1) == ([], False)


def test_a_helper_working_in_one_call_in_thirteen_is_not_past_the_policy(htam_home):
    verdict = measure(CANDIDATES / "honest" / "rare_helper.py", allow_torch=("softmax", "_softmax"))
    assert verdict.correct and verdict.error is None, verdict.error
    assert verdict.spread["threads_seen"] == timing_threads()
    assert verdict.spread["disturbed_share"] > 0, "its calls were not left out"


def test_a_helper_in_a_third_of_the_calls_disturbs_the_timing_and_is_not_cheating(htam_home):
    """As a thread of the harness held up under load looks: its pairs are left out, and
    so many left out make the verdict noisy, never `cheating`."""
    path = CANDIDATES / "honest" / "rare_helper.py"
    source = path.read_text().replace("EVERY = 13", "EVERY = 3")
    verdict = measure(path, source, allow_torch=("softmax", "_softmax"))
    assert verdict.correct and verdict.error is None, verdict.error
    assert verdict.spread["disturbed_share"] > tasks.TOLERATED_SHARE
    assert verdict.noisy


def test_ancestors_walk_up_to_init() -> None:
    above = ancestors(os.getpid())
    assert above[0] == os.getppid() and above[-1] == 1
