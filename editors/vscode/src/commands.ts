/** Arguments for the server's commands when the user runs them from the palette (no `vscode`). */

import { MAX_STEPS, MIN_STEPS } from "./vocabulary";

/** Server commands: vscode-languageclient registers these ids itself. */
export const SERVER_COMMANDS = [
  "htam.nextStep",
  "htam.optimize",
  "htam.explain",
  "htam.results",
  "htam.compileCheck",
  "htam.showMemory",
  "htam.cancel",
] as const;

export interface EditorContext {
  /** The active editor's document URI, as the server knows it. */
  uri?: string;
  position?: { line: number; character: number };
  /** The `htam.steps` setting. */
  steps: number;
  /** The newest running job, for Cancel. */
  jobId?: string;
}

/** A problem the user fixes (for example: no editor open); shown as a message, not thrown on. */
export class CommandError extends Error {}

function kernelArgument(context: EditorContext): Record<string, unknown> {
  if (!context.uri) {
    throw new CommandError("HTAM: open a kernel file (.cu or .py) first.");
  }
  return context.position ? { uri: context.uri, position: context.position } : { uri: context.uri };
}

/**
 * Callers that pass arguments (code lenses, other extensions, tests) get them through
 * unchanged; a call without arguments comes from the palette or a key binding and is
 * completed from the active editor.
 */
export function commandArguments(
  command: string,
  args: unknown[],
  context: EditorContext,
): unknown[] {
  if (args.length > 0) {
    return args;
  }
  switch (command) {
    case "htam.nextStep":
    case "htam.explain":
    case "htam.results":
    case "htam.compileCheck":
      return [kernelArgument(context)];
    case "htam.optimize":
      return [{ ...kernelArgument(context), steps: context.steps }];
    case "htam.cancel":
      return [context.jobId ? { jobId: context.jobId } : {}];
    case "htam.showMemory":
      // The server shows the memory of the open kernel's backend (cuda or cpu).
      return [context.uri ? { uri: context.uri } : {}];
    default:
      return args;
  }
}

/** Whether the call came from the palette, so its result should be shown to the user. */
export function isInteractive(args: unknown[]): boolean {
  return args.length === 0;
}

/** Validates the "how many steps" input box; `undefined` means valid. */
export function stepsInputError(value: string): string | undefined {
  const trimmed = value.trim();
  if (!/^\d+$/.test(trimmed)) {
    return "Enter a whole number of steps, for example 6.";
  }
  const steps = Number(trimmed);
  return steps >= MIN_STEPS && steps <= MAX_STEPS
    ? undefined
    : `Choose between ${MIN_STEPS} and ${MAX_STEPS} steps.`;
}

/** What to tell the user when a step was asked for a kernel that is already being optimized. */
export function alreadyRunning(result: unknown): string | undefined {
  if (typeof result !== "object" || result === null) {
    return undefined;
  }
  const { alreadyRunning: running, jobId } = result as Record<string, unknown>;
  return running === true
    ? `HTAM: this file is already being optimized (job ${String(jobId)}); wait for it or run HTAM: Cancel.`
    : undefined;
}

/** The Markdown a command answered with (`htam.explain`, `htam.showMemory`), if any. */
export function markdownOf(result: unknown): string | undefined {
  if (typeof result !== "object" || result === null) {
    return undefined;
  }
  const markdown = (result as Record<string, unknown>).markdown;
  return typeof markdown === "string" ? markdown : undefined;
}

/** The speedup plot a command answered with (`htam.results`): a PNG path, if any. */
export function plotOf(result: unknown): string | undefined {
  if (typeof result !== "object" || result === null) {
    return undefined;
  }
  const plot = (result as Record<string, unknown>).plot;
  return typeof plot === "string" && plot ? plot : undefined;
}

/**
 * `markdown` with its plot image inlined as a data URI: the HTAM view shows it in any
 * window, remote ones (code-server) included, where a file: link is not a resource the
 * view may load.
 */
export function withInlinePlot(markdown: string, png: Uint8Array): string {
  const data = `data:image/png;base64,${Buffer.from(png).toString("base64")}`;
  return markdown.replace(
    /!\[([^\]]*)\]\([^)\s]*\.png\)/,
    (_match, alt: string) => `![${alt}](${data})`,
  );
}
