import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import {
  findInterpreter,
  existingInterpreter,
  installHint,
  interpreterCandidates,
  isNotFound,
  interpreterChoices,
  probeInterpreter,
  workspaceInterpreters,
} from "../src/interpreter";

const base = { setting: "", pythonExtension: undefined, trusted: true, platform: "linux" } as const;

test("an explicit setting is the only candidate", () => {
  const candidates = interpreterCandidates({
    ...base,
    setting: " /opt/py/bin/python ",
    pythonExtension: "/env/python",
  });
  assert.deepEqual(candidates, [{ command: "/opt/py/bin/python", source: "setting" }]);
});

test("the Python extension's environment comes before PATH when trusted", () => {
  const candidates = interpreterCandidates({ ...base, pythonExtension: "/env/python" });
  assert.deepEqual(
    candidates.map((c) => c.source),
    ["python-extension", "path"],
  );
  assert.equal(candidates[1]?.command, "python3");
});

test("a workspace-chosen environment is not used in Restricted Mode", () => {
  const candidates = interpreterCandidates({
    ...base,
    pythonExtension: "/ws/.venv/bin/python",
    trusted: false,
  });
  assert.deepEqual(candidates, [{ command: "python3", source: "path" }]);
});

test("Windows looks for python, not python3", () => {
  assert.equal(interpreterCandidates({ ...base, platform: "win32" })[0]?.command, "python");
});

test("a missing interpreter is reported as not found", async () => {
  const result = await probeInterpreter(join(tmpdir(), "no-such-python-htam"));
  assert.equal(result.ok, false);
  assert.match(result.detail, /not found/);
});

/** A real python3 that sees no site-packages, so htam_lsp can only come from the cwd. */
function isolatedPython(): string {
  const dir = mkdtempSync(join(tmpdir(), "htam-probe-"));
  const wrapper = join(dir, "python-isolated");
  writeFileSync(wrapper, '#!/bin/sh\nexec python3 -S -E -s "$@"\n', { mode: 0o755 });
  return wrapper;
}

test("an interpreter without htam_lsp reports the import error", async () => {
  const result = await probeInterpreter(isolatedPython());
  assert.equal(result.ok, false);
  assert.match(result.detail, /ModuleNotFoundError: No module named 'htam_lsp'/);
});

test("a htam_lsp folder in the working directory does not count as installed", async () => {
  const workspace = mkdtempSync(join(tmpdir(), "htam-workspace-"));
  mkdirSync(join(workspace, "htam_lsp"));
  writeFileSync(join(workspace, "htam_lsp", "__init__.py"), "");
  const result = await probeInterpreter(isolatedPython(), workspace);
  assert.equal(result.ok, false);
  assert.match(result.detail, /No module named 'htam_lsp'/);
});

test("findInterpreter takes the first candidate that works", async () => {
  const probed: string[] = [];
  const { found, failures } = await findInterpreter(
    [
      { command: "/broken/python", source: "python-extension" },
      { command: "python3", source: "path" },
    ],
    async (command) => {
      probed.push(command);
      return command === "python3" ? { ok: true, detail: "" } : { ok: false, detail: "boom" };
    },
  );
  assert.equal(found?.command, "python3");
  assert.deepEqual(probed, ["/broken/python", "python3"]);
  assert.deepEqual(failures, [
    "/broken/python (from the Python extension's active environment): boom",
  ]);
});

test("the install hint names the interpreter and the install from a checkout", () => {
  const hint = installHint(
    [{ command: "/usr/bin/python3", source: "path" }],
    ["/usr/bin/python3 (from PATH): No module named 'htam_lsp'"],
    "/usr/bin/python3",
  );
  assert.match(hint, /`\/usr\/bin\/python3 -m pip install -e <path-to-htam>`/);
  assert.match(hint, /htam-lsp, is not on PyPI yet/);
  assert.match(hint, /No module named 'htam_lsp'/);
  assert.match(hint, /htam\.interpreter/);
});

test("the advice never pip-installs into an interpreter that does not exist", async () => {
  const missing = join(tmpdir(), "no-such-python-htam");
  const existing = await existingInterpreter([missing, "python3"]);
  assert.equal(existing, "python3");
  const hint = installHint(
    [{ command: missing, source: "setting" }],
    [`${missing} (from the htam.interpreter setting): the interpreter was not found`],
    existing,
  );
  assert.doesNotMatch(hint, new RegExp(`${missing} -m pip`));
  assert.match(hint, /`python3 -m pip install -e <path-to-htam>`/);
  assert.match(hint, /set htam\.interpreter to python3/);
  assert.match(installHint([], [], undefined), /No Python runs here/);
});

test("a pyenv shim of a version that is not installed is said to be not found", async () => {
  const dir = mkdtempSync(join(tmpdir(), "htam-shim-"));
  const shim = join(dir, "python3.99");
  const says = "pyenv: python3.99: command not found\\n\\nNote: See 'pyenv help global' for tips";
  writeFileSync(shim, `#!/bin/sh\nprintf "${says}\\n" >&2\nexit 127\n`, { mode: 0o755 });
  const result = await probeInterpreter(shim);
  assert.equal(isNotFound(result), true);
  assert.match(result.detail, /pyenv: python3\.99: command not found/);
});

test("the interpreter pick lists those that can run htam-lsp first, each once", () => {
  const failed = { ok: false, detail: "ModuleNotFoundError: No module named 'htam_lsp'" };
  const rows = interpreterChoices([
    { command: "python3", result: failed },
    { command: "/venv/bin/python", result: { ok: true, detail: "" } },
    { command: "python3", result: failed },
  ]);
  assert.deepEqual(
    rows.map((r) => [r.label, r.ok]),
    [
      ["/venv/bin/python", true],
      ["python3", false],
    ],
  );
  assert.match(rows[1]?.description ?? "", /^cannot: ModuleNotFoundError/);
});

test("virtual environments in the workspace folders are candidates (trusted only)", () => {
  assert.deepEqual(workspaceInterpreters(["/w"], "linux"), [
    "/w/.venv/bin/python",
    "/w/venv/bin/python",
    "/w/env/bin/python",
  ]);
  // A subfolder of the project is open: the project's .venv above it is offered too.
  const nested = workspaceInterpreters(["/p/examples/softmax"], "linux");
  assert.equal(nested[0], "/p/examples/softmax/.venv/bin/python");
  assert.ok(nested.includes("/p/.venv/bin/python"), nested.join(", "));
  assert.ok(!nested.some((path) => path.startsWith("/.venv")), "never the root's");
  assert.equal(workspaceInterpreters(["C:\\w"], "win32")[0], "C:\\w\\.venv\\Scripts\\python.exe");
});
