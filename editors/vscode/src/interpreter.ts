/** Finding a Python interpreter that can run `htam-lsp` (no `vscode` import: unit-tested). */
import { type ExecFileException, execFile } from "node:child_process";

export type InterpreterSource = "setting" | "python-extension" | "path";

export interface InterpreterCandidate {
  command: string;
  source: InterpreterSource;
}

export interface InterpreterInputs {
  /** The `htam.interpreter` setting (VS Code drops workspace values in Restricted Mode). */
  setting: string;
  /** The Python extension's active environment, when that extension is installed. */
  pythonExtension: string | undefined;
  /** Whether the workspace is trusted: a workspace-chosen environment is not used otherwise. */
  trusted: boolean;
  platform: NodeJS.Platform;
}

export interface ProbeResult {
  ok: boolean;
  /** What went wrong, in one line, when `ok` is false. */
  detail: string;
}

const SOURCE_LABELS: Record<InterpreterSource, string> = {
  setting: "the htam.interpreter setting",
  "python-extension": "the Python extension's active environment",
  path: "PATH",
};

const PROBE_TIMEOUT_MS = 20_000;

/**
 * `-P` keeps the working directory (the workspace) off `sys.path`: a folder named
 * `htam_lsp` in an untrusted workspace must not be what runs. htam needs Python 3.11+,
 * which is also where `-P` appeared.
 */
const SAFE_PATH = "-P";

/** Arguments that start the server on stdio. */
export const SERVER_ARGS = [
  SAFE_PATH,
  "-c",
  "import sys; from htam_lsp.server import main; sys.exit(main())",
];

/**
 * Interpreters to try, best first. An explicit setting is the only candidate: a user who
 * named an interpreter wants to hear that it is wrong, not to get another one silently.
 */
export function interpreterCandidates(inputs: InterpreterInputs): InterpreterCandidate[] {
  const setting = inputs.setting.trim();
  if (setting) {
    return [{ command: setting, source: "setting" }];
  }
  const candidates: InterpreterCandidate[] = [];
  if (inputs.trusted && inputs.pythonExtension) {
    candidates.push({ command: inputs.pythonExtension, source: "python-extension" });
  }
  const onPath = inputs.platform === "win32" ? "python" : "python3";
  candidates.push({ command: onPath, source: "path" });
  return candidates;
}

export function describe(candidate: InterpreterCandidate): string {
  return `${candidate.command} (from ${SOURCE_LABELS[candidate.source]})`;
}

/** Runs `python -P -c "import htam_lsp"` in `cwd` and reports why it failed, if it did. */
export function probeInterpreter(command: string, cwd?: string): Promise<ProbeResult> {
  return new Promise((resolve) => {
    execFile(
      command,
      [SAFE_PATH, "-c", "import htam_lsp"],
      { timeout: PROBE_TIMEOUT_MS, windowsHide: true, ...(cwd ? { cwd } : {}) },
      (error, _stdout, stderr) => {
        if (!error) {
          resolve({ ok: true, detail: "" });
          return;
        }
        resolve({ ok: false, detail: probeFailure(error, stderr) });
      },
    );
  });
}

/** What `probeInterpreter` says of a command that runs no Python at all. */
export const NOT_FOUND = "the interpreter was not found";

function probeFailure(error: ExecFileException, stderr: string): string {
  if (error.code === "ENOENT") {
    return NOT_FOUND;
  }
  if (error.killed) {
    return `the interpreter did not answer within ${PROBE_TIMEOUT_MS / 1000} s`;
  }
  const lines = stderr.trim().split(/\r?\n/);
  // A pyenv (or asdf) shim of a version that is not installed: its first line says so,
  // its last one only gives tips.
  if (/command not found|No such file/.test(lines[0] ?? "")) {
    return `${NOT_FOUND} (${lines[0]?.trim()})`;
  }
  return lines[lines.length - 1] || error.message;
}

/** Whether a probe found no Python at all behind the command. */
export function isNotFound(result: ProbeResult): boolean {
  return !result.ok && result.detail.startsWith(NOT_FOUND);
}

/** The first of `commands` that runs a Python, with or without htam: where pip can put it. */
export async function existingInterpreter(
  commands: string[],
  probe: (command: string) => Promise<ProbeResult> = probeInterpreter,
): Promise<string | undefined> {
  for (const command of commands) {
    if (!isNotFound(await probe(command))) {
      return command;
    }
  }
  return undefined;
}

/** The first candidate that can import `htam_lsp`, or the reasons why none could. */
export async function findInterpreter(
  candidates: InterpreterCandidate[],
  probe: (command: string) => Promise<ProbeResult> = probeInterpreter,
): Promise<{ found?: InterpreterCandidate; failures: string[] }> {
  const failures: string[] = [];
  for (const candidate of candidates) {
    const result = await probe(candidate.command);
    if (result.ok) {
      return { found: candidate, failures };
    }
    failures.push(`${describe(candidate)}: ${result.detail}`);
  }
  return { failures };
}

/** Where the user's HTAM checkout is, in an install command they complete. */
export const CHECKOUT = "<path-to-htam>";

/**
 * The pip command that installs the server into `python`: from a checkout, as the package
 * (`htam-lsp`) is not on PyPI yet, and `htam` there is an unrelated project.
 */
export function installCommand(python: string): string {
  return `${python} -m pip install -e ${CHECKOUT}`;
}

/**
 * One message saying exactly how to make `htam-lsp` available, with an interpreter that
 * exists (`existing`): pip cannot install into one that is not there.
 */
export function installHint(
  candidates: InterpreterCandidate[],
  failures: string[],
  existing: string | undefined,
): string {
  const why = `HTAM: htam-lsp cannot be started (${failures.join("; ")}). `;
  if (!existing) {
    return (
      why +
      `No Python runs here: install Python 3.11 or newer, then \`${installCommand("python3")}\` ` +
      "(a checkout of HTAM), or set htam.interpreter to a Python that has it."
    );
  }
  const named = candidates[0]?.command;
  const setIt = named === existing ? "" : `, and set htam.interpreter to ${existing}`;
  return (
    why +
    `Install it from a checkout of HTAM with \`${installCommand(existing)}\`${setIt} ` +
    "(its package, htam-lsp, is not on PyPI yet); or set htam.interpreter to a Python " +
    "that has it."
  );
}

/** Interpreter names worth trying on PATH, besides the configured candidates. */
export const PATH_NAMES = ["python3", "python3.13", "python3.12", "python3.11", "python"];

export interface Probed {
  command: string;
  result: ProbeResult;
}

/** Quick pick rows: interpreters that can run htam-lsp first, each said once. */
export function interpreterChoices(
  probed: Probed[],
): { label: string; description: string; ok: boolean }[] {
  const seen = new Set<string>();
  const rows = [];
  for (const { command, result } of probed) {
    if (seen.has(command)) {
      continue;
    }
    seen.add(command);
    rows.push({
      label: command,
      description: result.ok ? "can run htam-lsp" : `cannot: ${result.detail}`,
      ok: result.ok,
    });
  }
  return rows.sort((a, b) => Number(b.ok) - Number(a.ok));
}

/** How many folders above a workspace folder are searched for the project's venv. */
const PARENT_LEVELS = 3;

/**
 * Virtual environments in the workspace folders and in the folders above them (the open
 * folder may be a subfolder of the project), nearest first; used only in a trusted
 * workspace.
 */
export function workspaceInterpreters(folders: string[], platform: NodeJS.Platform): string[] {
  const [bin, exe] = platform === "win32" ? ["Scripts", "python.exe"] : ["bin", "python"];
  const sep = platform === "win32" ? "\\" : "/";
  const found = folders.flatMap((folder) =>
    withParents(folder, sep).flatMap((dir) =>
      [".venv", "venv", "env"].map((name) => [dir, name, bin, exe].join(sep)),
    ),
  );
  return [...new Set(found)];
}

/** `folder` and up to PARENT_LEVELS folders above it (never the root itself). */
function withParents(folder: string, sep: string): string[] {
  const dirs = [folder];
  let current = folder;
  for (let level = 0; level < PARENT_LEVELS; level++) {
    const cut = current.lastIndexOf(sep);
    if (cut <= 0 || /^[A-Za-z]:$/.test(current.slice(0, cut))) {
      break;
    }
    current = current.slice(0, cut);
    dirs.push(current);
  }
  return dirs;
}
