/** The server's `htam.status` answer -> status bar text and tooltip (no `vscode` import). */

export interface ServerStatus {
  provider: string;
  providerWhy: string;
  gpu: string | null;
  device: string;
  deviceWhy: string;
  compilers: Record<string, string | null>;
  sandbox: string;
  sandboxWhy: string;
  executionAllowed: boolean;
  howToAllow: string;
  /** This machine's measured limits in one line (or why there are none yet). */
  machine: string;
  problems: string[];
}

function record(value: unknown): Record<string, unknown> {
  return typeof value === "object" && value !== null ? (value as Record<string, unknown>) : {};
}

function text(value: unknown, fallback = ""): string {
  return typeof value === "string" ? value : fallback;
}

/** Validates the answer; `undefined` when it is not one. */
export function parseStatus(value: unknown): ServerStatus | undefined {
  const raw = record(value);
  const provider = record(raw.provider);
  const execution = record(raw.execution);
  if (typeof provider.name !== "string" || typeof execution.allowed !== "boolean") {
    return undefined;
  }
  const gpu = record(raw.gpu);
  const device = record(raw.device);
  const sandbox = record(raw.sandbox);
  const machine = record(raw.machine);
  const compilers: Record<string, string | null> = {};
  for (const [name, path] of Object.entries(record(raw.compilers))) {
    compilers[name] = typeof path === "string" ? path : null;
  }
  return {
    provider: provider.name,
    providerWhy: text(provider.why),
    gpu: gpu.present === true ? text(gpu.name, "NVIDIA GPU") : null,
    device: text(device.name, "?"),
    deviceWhy: text(device.why),
    compilers,
    sandbox: text(sandbox.mode, "unknown"),
    sandboxWhy: text(sandbox.why),
    executionAllowed: execution.allowed,
    howToAllow: text(execution.howToAllow),
    machine: text(machine.summary, "not reported by the server"),
    problems: Array.isArray(raw.problems) ? raw.problems.filter((p) => typeof p === "string") : [],
  };
}

/** A short suffix for the idle status item: "offline · cpu". */
export function statusBrief(status: ServerStatus): string {
  const llm = status.provider === "offline" ? "no LLM" : status.provider;
  return `${llm} · ${status.device}${status.problems.length ? " · settings ignored" : ""}`;
}

/** The tooltip: every fact, one line each, in the server's words. */
export function statusTooltip(status: ServerStatus): string {
  const compilers = Object.entries(status.compilers)
    .map(([name, path]) => `${name}: ${path ?? "not found"}`)
    .join("; ");
  const lines = [
    `LLM: ${status.provider} (${status.providerWhy})`,
    `GPU: ${status.gpu ?? "none"}; candidates run on ${status.device} (${status.deviceWhy})`,
    `Compilers: ${compilers}`,
    `Sandbox: ${status.sandbox} (${status.sandboxWhy})`,
    `Machine: ${status.machine}`,
    status.executionAllowed
      ? "Execution: allowed"
      : `Execution: off; to allow it: ${status.howToAllow}`,
    ...status.problems.map((problem) => `Ignored setting: ${problem}`),
  ];
  return lines.join("\n");
}
