"""The server's pure pieces: position conversion, minimal edits, line mapping, settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from htam_engine import events
from htam_engine.evaluate.verdict import Duel, Verdict
from htam_lsp import render
from htam_lsp import suggestions as sg
from htam_lsp.diagnostics import map_line
from htam_lsp.jobs import Job, ending
from htam_lsp.offers import minimal_change
from htam_lsp.positions import UTF8, UTF16, UTF32, LineIndex, encode
from htam_lsp.settings import Settings

LINE = "a é 𝛼 b\r\nsecond\rthird\n"


def test_positions_in_each_encoding_round_trip():
    index = LineIndex(encode(LINE))
    b_offset = encode(LINE).index(b"b")
    assert index.position(b_offset, UTF8) == (0, 10)  # a, space, é(2), space, 𝛼(4), space
    assert index.position(b_offset, UTF16) == (0, 7)  # 𝛼 is a surrogate pair
    assert index.position(b_offset, UTF32) == (0, 6)
    for encoding in (UTF8, UTF16, UTF32):
        line, character = index.position(b_offset, encoding)
        assert index.offset(line, character, encoding) == b_offset
    # \r\n and a lone \r both end lines; out-of-range positions clamp.
    assert index.position(encode(LINE).index(b"third"), UTF16) == (2, 0)
    assert index.offset(1, 999, UTF16) == encode(LINE).index(b"\rthird")
    assert index.offset(99, 0, UTF8) == len(encode(LINE))


@given(st.text(alphabet="ab é𝛼\r\n", max_size=40))
def test_line_index_agrees_with_splitlines_and_round_trips(text: str):
    """bytes.splitlines ends lines where LSP does (\\n, \\r\\n, \\r); with or without \\r
    the index takes a different path, and both must agree with it."""
    data = encode(text)
    index = LineIndex(data)
    lines = data.splitlines(keepends=True) or [b""]
    if data.endswith((b"\n", b"\r")):
        lines.append(b"")
    assert index.line_count == len(lines)
    assert [index.line_bytes(i) for i in range(len(lines))] == [
        line.rstrip(b"\r\n") for line in lines
    ]
    for offset in range(len(data) + 1):
        if offset < len(data) and (data[offset] & 0xC0) == 0x80:
            continue  # inside a UTF-8 sequence: not a position
        for encoding in (UTF8, UTF16, UTF32):
            line, character = index.position(offset, encoding)
            if data[offset - 1 : offset + 1] != b"\r\n":  # not between \r and \n
                assert index.offset(line, character, encoding) == offset


@given(st.text(max_size=60), st.text(max_size=60))
def test_minimal_change_rebuilds_the_new_text(old: str, new: str):
    a, b = encode(old), encode(new)
    start, end, replacement = minimal_change(a, b)
    assert a[:start] + replacement + a[end:] == b
    # Never splits a UTF-8 sequence: both ends decode cleanly.
    a[:start].decode("utf-8", "surrogatepass")
    a[end:].decode("utf-8", "surrogatepass")


def test_compile_error_line_maps_through_inserted_lines():
    current = "int a;\nint b;\nint c;\n"
    candidate = "int a;\n#include <x>\n#include <y>\nint b;\nint c = ;\n"
    assert map_line(candidate, current, 3) == 1  # "int b;" is line 1 of the current text
    assert map_line(candidate, current, 4) == 2  # the changed line maps onto its old self


def test_settings_validation_and_execution_grant():
    base, problems = Settings().merged(
        {"provider": "openai", "steps": 3, "baseUrl": "http://x", "allowExecution": True},
        may_allow=True,
    )
    assert problems == [] and base.allow_execution and base.steps == 3
    assert base.base_url == "http://x"
    later, problems = base.merged(
        {"htam": {"provider": "nope", "allowExecution": False}}, may_allow=False
    )
    assert later.provider == "openai" and not later.allow_execution
    assert problems and "htam.provider" in problems[0]
    denied, _ = Settings().merged({"allowExecution": True}, may_allow=False)
    assert not denied.allow_execution
    _, problems = Settings().merged("not an object", may_allow=True)
    assert problems


KERNEL = "void k(float* x) {\n  x[0] = 1;\n}\n"
FILE = f"// head\n{KERNEL}// between\n{KERNEL.replace('k(', 'h(')}// tail\n"


@given(st.text(alphabet="ab\n", max_size=30), st.text(alphabet="abc\n", max_size=30))
def test_anchor_rebuilds_the_candidate_from_text_found_once(start: str, candidate: str):
    found = sg.anchor(start, candidate, [])
    if found is None:
        assert candidate in (start, "")
        return
    assert start.count(found.old) == 1 or found.old == start
    at = start.find(found.old)
    assert start[:at] + found.new + start[at + len(found.old) :] == candidate


def test_anchor_widens_to_the_kernel_and_survives_edits_elsewhere():
    k = FILE.index("void k")
    kernel = (k, k + len(KERNEL))
    candidate = FILE.replace("x[0] = 1;", "x[0] = 2;", 1)
    found = sg.anchor(FILE, candidate, [kernel])
    assert found is not None and found.old == KERNEL  # the whole kernel, not one line
    confirmed = sg.Claim(True, 0, 1.5, 1.4, 1.6)
    record = sg.StepRecord(1, _step(1.5, candidate), 0.0, found, claim=confirmed)
    elsewhere = FILE.replace("// tail", "// tail, edited")
    offer = sg.offer([record], elsewhere, 1.1)
    assert [s.record for s in offer.suggestions] == [record] and not offer.dropped
    changed = FILE.replace("x[0] = 1;", "x[0] = 3;", 1)
    assert sg.offer([record], changed, 1.1).dropped == [record]
    assert sg.offer([record], FILE, 1.6).slower == [record]  # under the threshold
    estimated = replace(record, claim=None)
    assert sg.offer([estimated], FILE, 1.1).slower == [estimated]  # never timed in pairs
    untimed = sg.StepRecord(2, replace(_step(1.0, candidate), speedup=None), 0.0, found)
    assert sg.offer([untimed], FILE, 1.1).untimed == [untimed]  # correct, never timed
    done = sg.offer([record], candidate, 1.1)  # the suggestion was applied
    assert done.applied == [record] and not done.dropped and not done.suggestions


def test_non_portable_edits_are_named():
    old = 'extra_cflags=["-O3"]'
    record = sg.StepRecord(
        1, _step(1.3, ""), 0.0, sg.Anchor(old, 'extra_cflags=["-O3", "-march=native"]')
    )
    assert record.non_portable == ["-march=native"]
    assert sg.StepRecord(1, _step(1.3, ""), 0.0, sg.Anchor(old, old)).non_portable == []


def _step(speedup: float, source: str) -> events.Step:
    verdict = Verdict(compiled=True, correct=True, speedup=2.0, runtime_ms=1.0)
    return events.Step(1, "g", "l", "why", "improved", 0.5, speedup, verdict=verdict, source=source)


def test_a_job_ends_with_the_engines_own_word():
    job = Job("file:///k.cu", "k", 1)
    job.last = events.Failed("no GPU here to run k.cu", "user_error")
    assert ending(job, 1, "Traceback ...") == ("failed", "no GPU here to run k.cu")
    job.last = events.Result("r", "k", False, None, None, 0, "cannot run: no GPU", "out")
    assert ending(job, 1, "") == ("failed", "cannot run: no GPU")
    job.steps_done, job.message = 1, "best 1.2x"
    assert ending(job, 1, "") == ("done", "best 1.2x")  # not correct, but it measured a step
    job.last = None
    state, message = ending(job, -9, "last words\n")
    assert state == "failed" and "exit code -9" in message and "last words" in message
    job.cancel_requested = True
    assert ending(job, -15, "")[0] == "cancelled"


def test_titles_label_non_portable_edits_first_and_say_only_what_the_name_does_not():
    from htam_lsp import render
    from htam_lsp.offers import _said

    old, new = 'cflags=["-O2"]', 'cflags=["-O3", "-march=native"]'
    claim = sg.Claim(True, 0, 1.5, 1.4, 1.6)
    record = sg.StepRecord(1, _step(1.5, ""), 0.0, sg.Anchor(old, new), claim=claim)
    title = render.action_title(None, record)
    assert (
        title == "HTAM: apply g -> l [non-portable: -march=native]: 1.50x faster (95 % 1.40-1.60)"
    )
    said = render.suggestion_text(None, record, ["restrict pointers"])
    assert said.endswith("(95 % 1.40-1.60; 1.5 -> 1 ms), correct; also adds restrict pointers")
    name = "-o3 -march=native"
    assert _said("march_native", name) and _said("opt_O3", name)
    assert not _said("restrict_pointers", name)


def test_a_step_is_offered_only_on_the_engines_confirmed_paired_word():
    """A record's claim comes from its duel (against the start or the best so far) and,
    for the run's best, from its re-timing against the start; an estimate is never
    offered, nor a duel the engine refused."""

    def timed(n: int, over_start: float, duel: Duel | None) -> sg.StepRecord:
        verdict = Verdict(compiled=True, correct=True, speedup=over_start / 2)
        status = "improved" if duel and duel.confirmed else "not_improved"
        step = events.Step(n, "g", f"l{n}", "", status, 0.1, over_start, verdict=verdict)
        step = replace(step, versus_best=duel)
        return sg.StepRecord(10 + n, step, 0.0, sg.Anchor("a", "b"), claim=sg.duel_claim(step, 0))

    refused = timed(1, 1.39, Duel(0.96, 0.64, 1.42, confirmed=False))
    won = timed(2, 1.66, Duel(1.5, 1.4, 1.6, confirmed=True))
    unpaired = timed(3, 1.8, None)
    assert (refused.confirmed, won.confirmed, unpaired.claim) == (False, True, None)
    assert (refused.judged, won.judged, unpaired.judged) == (None, 1.4, None)
    assert render.interval_text(unpaired) == "est. 1.80x"
    result = events.Result("r", "k", True, 1.57, 0.8, 2, "completed", "out", "", 1.54, 1.60)
    claims = sg.run_claims(result, [refused, won, unpaired])
    assert claims == {12: sg.Claim(True, 0, 1.57, 1.54, 1.60)}
    start_is_best = events.Result("r", "k", True, 1.0, 0.5, 0, "completed", "out", "", 0.9, 1.1)
    assert sg.run_claims(start_is_best, [refused, won]) == {}
    best = replace(won, claim=claims[12])
    assert render.interval_text(best) == "1.57x (95 % 1.54-1.60)"
    offer = sg.offer([refused, unpaired, best], "xax", 1.1)
    assert [s.record.n for s in offer.suggestions] == [12]
    assert [r.n for r in offer.slower] == [11, 13]
    stored = sg.StepRecord.from_json(best.to_json())
    assert stored is not None and stored.claim == best.claim
    legacy = {**best.to_json(), "claim": None, "paired": 1.57, "low": 1.54, "high": 1.6}
    assert sg.StepRecord.from_json(legacy).claim == claims[12]  # type: ignore[union-attr]


def test_stop_asks_with_sigterm_then_kills_what_ignores_it():
    """The one cancellation protocol, on real process groups: a process that handles
    SIGTERM ends on it (and may say its last word); one that ignores it is killed after
    the grace period; both jobs end cancelled."""
    import asyncio
    import sys

    from htam_lsp.jobs import JobManager

    polite = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
    stubborn = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    started = 'print(\'{"event": "error", "message": "up"}\', flush=True)\ntime.sleep(60)\n'

    async def run(code: str) -> tuple[Job, float]:
        jobs = JobManager(grace_s=0.5)
        job = jobs.create("file:///k.py", "k", 1)
        argv = [sys.executable, "-c", code + started]
        task = asyncio.create_task(jobs.run(job, argv, lambda j, e: None))
        while job.last is None:  # the process is up and has handled its signals
            await asyncio.sleep(0.02)
        begun = asyncio.get_running_loop().time()
        jobs.stop(job)
        await asyncio.wait_for(task, 10)
        return job, asyncio.get_running_loop().time() - begun

    job, took = asyncio.run(run(polite))
    assert job.state == "cancelled" and took < 0.5  # SIGTERM was enough
    job, took = asyncio.run(run(stubborn))
    assert job.state == "cancelled" and 0.5 <= took < 5  # killed after the grace period


def test_the_hover_preview_follows_a_changed_memory(tmp_path: Path):
    """The preview is cached per document version *and* graph revision: an outcome the
    memory learned (a step, another process) gives a new preview, not the cached one."""
    from htam_engine.memory import MemoryStore
    from htam_engine.memory.model import START, Outcome
    from htam_lsp import discovery, insight
    from htam_lsp.documents import Document

    path = Path(__file__).parent / "fixtures/lsp/cuda/scale_bound.cu"
    doc = Document(path.as_uri(), "cuda-cpp", 1, path.read_bytes())
    unit = next(u for u in discovery.units(doc) if u.name == "scale")
    with MemoryStore(tmp_path) as store:
        before = store.graph("cuda")
        first = insight.preview(doc, unit, before)
        assert insight.preview(doc, unit, store.graph("cuda")) is first  # same content
        chosen = first[1].chosen
        local = before.locals_of(chosen)[0].id
        store.apply_outcome(
            Outcome(
                "cuda",
                "cuda:elementwise:scale",
                [START],
                [1.0],
                chosen,
                local,
                "incorrect",
                True,
                False,
                None,
                None,
                -1.0,
                "",
            )  # fmt: skip
        )
        after = store.graph("cuda")
        assert after.revision != before.revision
        second = insight.preview(doc, unit, after)
    assert second is not first and second[1] != first[1]


def test_the_engines_report_gives_one_number_per_question():
    """The issue's report: step 1 "3.94x vs start" next to its duel 7.77x (95 % 2.54-23.78)
    and a best of 7.77x; step 2 "8.46x vs start" refused. Now the paired number answers
    "how much faster than the start", and a ratio is shown only as a labelled estimate."""
    from htam_engine.loop import RunResult
    from htam_engine.report import markdown_report, versus_start

    def stepped(n: int, status: str, estimate: float, duel: Duel) -> events.Step:
        verdict = Verdict(compiled=True, correct=True, speedup=estimate / 2, runtime_ms=1.0)
        return events.Step(n, "g", f"l{n}", "", status, 0.1, estimate, verdict=verdict,
                           versus_best=duel)  # fmt: skip

    first = stepped(1, "improved", 3.94, Duel(7.77, 2.54, 23.78, confirmed=True))
    second = stepped(2, "not_improved", 8.46, Duel(0.9, 0.7, 1.2, confirmed=False, against=1))
    run = RunResult("r", "softmax", "cpu", "offline", None, [first, second], best_step=1,
                    over_start=Duel(7.77, 2.54, 23.78, confirmed=True))  # fmt: skip
    assert versus_start(run) == ["7.77x (95 % 2.54-23.78)", "est. 8.46x"]
    report = markdown_report(run)
    assert "| 3.94x |" not in report and "| 8.46x |" not in report, report
    assert "best (step 1): 7.77x (95 % 2.54-23.78) over the start" in report
