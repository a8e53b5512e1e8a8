import assert from "node:assert/strict";
import { test } from "node:test";
import { parseStatus, statusBrief, statusTooltip } from "../src/status";

const ANSWER = {
  provider: { name: "offline", why: "provider setting is offline" },
  gpu: { present: false, name: null },
  device: { name: "cpu", why: "auto: no NVIDIA GPU here" },
  compilers: { nvcc: "/usr/local/cuda/bin/nvcc", "g++": null },
  sandbox: { mode: "bwrap", why: "candidates run in a bubblewrap sandbox" },
  execution: { allowed: false, howToAllow: "trust the workspace" },
  machine: {
    measured: true,
    summary:
      "one core: 31.2 GB/s past the caches, 118 GFLOP/s FP32; 3 rounds, spread up to 9 % (stable)",
  },
  problems: ["workspace settings: htam.steps: expected an integer from 1 to 100"],
};

test("a malformed answer is rejected", () => {
  assert.equal(parseStatus(null), undefined);
  assert.equal(parseStatus({ provider: {}, execution: { allowed: true } }), undefined);
});

test("the status item and tooltip say the server's facts", () => {
  const status = parseStatus(ANSWER);
  assert.ok(status);
  assert.equal(statusBrief(status), "no LLM · cpu · settings ignored");
  const tooltip = statusTooltip(status);
  assert.match(tooltip, /^LLM: offline \(provider setting is offline\)$/m);
  assert.match(tooltip, /^GPU: none; candidates run on cpu \(auto: no NVIDIA GPU here\)$/m);
  assert.match(tooltip, /nvcc: \/usr\/local\/cuda\/bin\/nvcc; g\+\+: not found/);
  assert.match(tooltip, /^Sandbox: bwrap/m);
  assert.match(tooltip, /^Execution: off; to allow it: trust the workspace$/m);
  assert.match(
    tooltip,
    /^Machine: one core: 31.2 GB\/s past the caches, .*3 rounds, spread up to 9 % \(stable\)$/m,
  );
  assert.match(tooltip, /^Ignored setting: workspace settings: htam.steps/m);
});
