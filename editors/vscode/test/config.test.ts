import assert from "node:assert/strict";
import { test } from "node:test";
import { initializationOptions, serverEnvironment, withTrust } from "../src/config";

const settings = {
  provider: "replay",
  model: "",
  baseUrl: "",
  steps: 3,
  device: "cpu",
  cassette: "/c.json",
  minSpeedup: 1.25,
  startAhead: false,
};

test("initialization options carry trust and drop empty settings", () => {
  assert.deepEqual(initializationOptions(settings, false), {
    provider: "replay",
    steps: 3,
    device: "cpu",
    cassette: "/c.json",
    minSpeedup: 1.25,
    startAhead: false,
    allowExecution: false,
  });
  const trusted = initializationOptions({ ...settings, model: "m", baseUrl: "http://x" }, true);
  assert.equal(trusted.allowExecution, true);
  assert.equal(trusted.model, "m");
  assert.equal(trusted.baseUrl, "http://x");
});

test("stored keys reach the server's environment and win over the window's", () => {
  const env = serverEnvironment(
    { PATH: "/bin", ANTHROPIC_API_KEY: "from-env", OPENAI_API_KEY: "env-openai" },
    { anthropic: "stored" },
  );
  assert.equal(env.ANTHROPIC_API_KEY, "stored");
  assert.equal(env.OPENAI_API_KEY, "env-openai");
  assert.equal(env.PATH, "/bin");
});

test("the base environment is not modified", () => {
  const base = { PATH: "/bin" };
  serverEnvironment(base, { openai: "k" });
  assert.deepEqual(base, { PATH: "/bin" });
});

test("workspace/configuration answers for htam carry allowExecution", () => {
  const results = withTrust(
    ["htam", "python", "htam"],
    [{ provider: "auto" }, { x: 1 }, null],
    true,
  );
  assert.deepEqual(results, [{ provider: "auto", allowExecution: true }, { x: 1 }, null]);
});
