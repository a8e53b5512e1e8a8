import assert from "node:assert/strict";
import { test } from "node:test";
import {
  alreadyRunning,
  CommandError,
  commandArguments,
  isInteractive,
  markdownOf,
  plotOf,
  stepsInputError,
  withInlinePlot,
} from "../src/commands";

const editor = { uri: "file:///w/k.py", position: { line: 3, character: 4 }, steps: 6 };

test("explicit arguments pass through unchanged", () => {
  const args = [{ uri: "file:///other.cu" }];
  assert.equal(commandArguments("htam.nextStep", args, editor), args);
  assert.equal(isInteractive(args), false);
});

test("palette calls get the active editor's uri and position", () => {
  assert.deepEqual(commandArguments("htam.nextStep", [], editor), [
    { uri: "file:///w/k.py", position: { line: 3, character: 4 } },
  ]);
  assert.deepEqual(commandArguments("htam.explain", [], { uri: "file:///w/k.py", steps: 6 }), [
    { uri: "file:///w/k.py" },
  ]);
  assert.equal(isInteractive([]), true);
});

test("optimize adds the configured steps", () => {
  assert.deepEqual(commandArguments("htam.optimize", [], editor), [
    { uri: "file:///w/k.py", position: { line: 3, character: 4 }, steps: 6 },
  ]);
});

test("kernel commands without an editor raise a user-facing error", () => {
  assert.throws(() => commandArguments("htam.nextStep", [], { steps: 6 }), CommandError);
});

test("cancel and show memory need no editor", () => {
  assert.deepEqual(commandArguments("htam.cancel", [], { steps: 6, jobId: "j7" }), [
    { jobId: "j7" },
  ]);
  assert.deepEqual(commandArguments("htam.cancel", [], { steps: 6 }), [{}]);
  assert.deepEqual(commandArguments("htam.showMemory", [], { steps: 6 }), [{}]);
  assert.deepEqual(commandArguments("htam.showMemory", [], { uri: "file:///k.py", steps: 6 }), [
    { uri: "file:///k.py" },
  ]);
});

test("the steps input accepts 1 to 100 whole steps", () => {
  assert.equal(stepsInputError(" 12 "), undefined);
  assert.match(stepsInputError("0") ?? "", /between 1 and 100/);
  assert.match(stepsInputError("2.5") ?? "", /whole number/);
  assert.match(stepsInputError("") ?? "", /whole number/);
});

test("markdown is read from command results", () => {
  assert.equal(markdownOf({ markdown: "# HTG" }), "# HTG");
  assert.equal(markdownOf({ jobId: "j" }), undefined);
  assert.equal(markdownOf(null), undefined);
});

test("a second step on a busy file is explained, other results are not", () => {
  assert.match(
    alreadyRunning({ jobId: "j3", alreadyRunning: true }) ?? "",
    /already being optimized \(job j3\)/,
  );
  assert.equal(alreadyRunning({ jobId: "j4", state: "queued" }), undefined);
  assert.equal(alreadyRunning("x"), undefined);
});

test("the results' plot is inlined as a data URI, so any preview (remote too) shows it", () => {
  const markdown = "### HTAM results\n\n![speedup per step](file:///h/lsp-runs/j/speedup.png)\n";
  assert.equal(
    plotOf({ markdown, plot: "/h/lsp-runs/j/speedup.png" }),
    "/h/lsp-runs/j/speedup.png",
  );
  assert.equal(plotOf({ markdown, plot: null }), undefined);
  const inlined = withInlinePlot(markdown, new Uint8Array([0x89, 0x50, 0x4e, 0x47]));
  assert.equal(
    inlined,
    "### HTAM results\n\n![speedup per step](data:image/png;base64,iVBORw==)\n",
  );
  assert.equal(withInlinePlot("no plot here", new Uint8Array([1])), "no plot here");
});
