import assert from "node:assert/strict";
import { test } from "node:test";
import { type JobState, JobTracker, parseJobState, percent, progressMessage } from "../src/jobs";

const SERVER = { starting: false, trusted: true };

function job(fields: Partial<JobState>): JobState {
  const state = parseJobState({
    jobId: "j1",
    uri: "file:///k.py",
    kernel: "softmax",
    state: "running",
    ...fields,
  });
  assert.ok(state);
  return state;
}

test("malformed notifications are rejected", () => {
  assert.equal(parseJobState(null), undefined);
  assert.equal(parseJobState({ jobId: "x", state: "exploded" }), undefined);
  assert.equal(parseJobState({ state: "done" }), undefined);
});

test("missing or wrong-typed fields get neutral values", () => {
  const state = parseJobState({ jobId: "j", state: "done", step: "2", bestSpeedup: Number.NaN });
  assert.deepEqual(state, {
    jobId: "j",
    uri: "",
    kernel: "",
    state: "done",
    step: 0,
    steps: 0,
    phase: "",
    message: "",
    bestSpeedup: null,
    suggestions: 0,
  });
});

test("the tracker is idle before any job", () => {
  const view = new JobTracker().view(SERVER);
  assert.equal(view.running, false);
  assert.match(view.text, /idle/);
});

test("Restricted Mode and a starting server are visible when idle", () => {
  const tracker = new JobTracker();
  assert.match(tracker.view({ starting: false, trusted: false }).text, /restricted/);
  assert.match(tracker.view({ starting: true, trusted: true }).text, /starting/);
  tracker.update(job({ step: 1, steps: 2 }));
  assert.match(tracker.view({ starting: false, trusted: false }).text, /step 1 of 2/);
});

test("a running job shows its step of N", () => {
  const tracker = new JobTracker();
  tracker.update(job({ step: 2, steps: 6, phase: "compile" }));
  const view = tracker.view(SERVER);
  assert.equal(view.running, true);
  assert.match(view.text, /step 2 of 6/);
  assert.match(view.tooltip, /softmax/);
  assert.equal(tracker.current()?.jobId, "j1");
});

test("step 0 is shown as measuring the starting implementation", () => {
  const tracker = new JobTracker();
  tracker.update(job({ step: 0, steps: 3, phase: "time" }));
  assert.match(tracker.view(SERVER).text, /HTAM: measuring the start$/);
  assert.equal(
    progressMessage(job({ step: 0, steps: 1, phase: "verify" })),
    "measuring the start: verify",
  );
});

test("a finished job shows the best speedup and leaves no current job", () => {
  const tracker = new JobTracker();
  tracker.update(job({ step: 1, steps: 1 }));
  const done = { state: "done", step: 1, steps: 1, bestSpeedup: 1.8449, suggestions: 1 } as const;
  tracker.update(job(done));
  const view = tracker.view(SERVER);
  assert.equal(view.running, false);
  assert.match(view.text, /1\.84x/);
  assert.equal(tracker.current(), undefined);
});

test("a speedup with nothing offered is not shown as a result", () => {
  const tracker = new JobTracker();
  tracker.update(job({ state: "done", bestSpeedup: 1.04, suggestions: 0 }));
  assert.match(tracker.view(SERVER).text, /HTAM: nothing to apply$/);
});

test("the idle item and tooltip carry the server's htam.status", () => {
  const view = new JobTracker().view({ ...SERVER, brief: "no LLM · cpu", facts: "GPU: none" });
  assert.match(view.text, /HTAM: idle \(no LLM · cpu\)$/);
  assert.match(view.tooltip, /\n\nGPU: none$/);
});

test("refused and failed jobs say so", () => {
  const tracker = new JobTracker();
  tracker.update(job({ state: "refused", message: "workspace not trusted" }));
  assert.match(tracker.view(SERVER).text, /refused/);
  assert.match(tracker.view(SERVER).tooltip, /workspace not trusted/);
  tracker.update(job({ state: "failed" }));
  assert.match(tracker.view(SERVER).text, /failed/);
});

test("the newest active job wins, and the count of others is shown", () => {
  const tracker = new JobTracker();
  tracker.update(job({ jobId: "a", state: "queued" }));
  tracker.update(job({ jobId: "b", step: 1, steps: 3 }));
  assert.equal(tracker.current()?.jobId, "b");
  assert.match(tracker.view(SERVER).text, /step 1 of 3 \(\+1\)/);
  tracker.update(job({ jobId: "b", state: "cancelled" }));
  assert.equal(tracker.current()?.jobId, "a");
  assert.match(tracker.view(SERVER).text, /queued/);
});

test("progress percent is bounded and the message names step and phase", () => {
  assert.equal(percent(job({ step: 3, steps: 6 })), 50);
  assert.equal(percent(job({ step: 9, steps: 6 })), 100);
  assert.equal(percent(job({ steps: 0 })), 0);
  assert.equal(
    progressMessage(job({ step: 2, steps: 6, phase: "verify", message: "3 inputs" })),
    "step 2 of 6: verify - 3 inputs",
  );
  assert.equal(progressMessage(job({ state: "queued" })), "queued");
});
