/** `htam/jobState` notifications -> status bar text and progress (no `vscode` import). */

import { JOB_STATES, TERMINAL_JOB_STATES } from "./vocabulary";

export type JobPhase = (typeof JOB_STATES)[number];

export interface JobState {
  jobId: string;
  uri: string;
  kernel: string;
  state: JobPhase;
  step: number;
  steps: number;
  phase: string;
  message: string;
  bestSpeedup: number | null;
  /** Apply actions the server offers for the kernel now that the job has ended. */
  suggestions: number;
}

export interface StatusView {
  text: string;
  tooltip: string;
  running: boolean;
}

/** What the status bar needs to know about the server besides its jobs. */
export interface ServerState {
  starting: boolean;
  trusted: boolean;
  /** A few words from the server's htam.status, e.g. "no LLM · cpu". */
  brief?: string;
  /** The htam.status facts, one line each. */
  facts?: string;
}

const TERMINAL: ReadonlySet<JobPhase> = new Set(TERMINAL_JOB_STATES);

export function isTerminal(state: JobState): boolean {
  return TERMINAL.has(state.state);
}

function text(value: unknown): string {
  return typeof value === "string" ? value : "";
}

function count(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) ? value : 0;
}

/** Validates a notification payload; `undefined` when it is not a job state. */
export function parseJobState(value: unknown): JobState | undefined {
  if (typeof value !== "object" || value === null) {
    return undefined;
  }
  const raw = value as Record<string, unknown>;
  const state = raw.state;
  if (typeof raw.jobId !== "string" || !JOB_STATES.includes(state as JobPhase)) {
    return undefined;
  }
  const speedup = raw.bestSpeedup;
  return {
    jobId: raw.jobId,
    uri: text(raw.uri),
    kernel: text(raw.kernel),
    state: state as JobPhase,
    step: count(raw.step),
    steps: count(raw.steps),
    phase: text(raw.phase),
    message: text(raw.message),
    bestSpeedup: typeof speedup === "number" && Number.isFinite(speedup) ? speedup : null,
    suggestions: count(raw.suggestions),
  };
}

export function formatSpeedup(speedup: number): string {
  return `${speedup.toFixed(2)}x`;
}

/** Share of the job done, 0-100, for a progress bar. */
export function percent(state: JobState): number {
  if (state.steps <= 0) {
    return 0;
  }
  return Math.min(100, Math.max(0, (100 * state.step) / state.steps));
}

/** Step 0 is the worker compiling, verifying and timing the starting implementation. */
function stepLabel(state: JobState): string {
  return state.step === 0 ? "measuring the start" : `step ${state.step} of ${state.steps}`;
}

/** One line for a progress notification: "step 2 of 6: compile - message". */
export function progressMessage(state: JobState): string {
  const parts = [];
  if (state.steps > 0) {
    parts.push(stepLabel(state));
  }
  if (state.phase) {
    parts.push(state.phase);
  }
  const head = parts.join(": ") || state.state;
  return state.message ? `${head} - ${state.message}` : head;
}

/** Keeps the latest state of each job; the status bar shows the newest active one. */
export class JobTracker {
  private readonly active = new Map<string, JobState>();
  private last: JobState | undefined;

  update(state: JobState): void {
    if (isTerminal(state)) {
      this.active.delete(state.jobId);
    } else {
      this.active.delete(state.jobId);
      this.active.set(state.jobId, state);
    }
    this.last = state;
  }

  /** The newest job still queued or running. */
  current(): JobState | undefined {
    return [...this.active.values()].pop();
  }

  clear(): void {
    this.active.clear();
    this.last = undefined;
  }

  view(server: ServerState): StatusView {
    if (server.starting) {
      return {
        text: "$(loading~spin) HTAM: starting",
        tooltip: "HTAM: starting htam-lsp",
        running: false,
      };
    }
    const current = this.current();
    if (current) {
      return runningView(current, this.active.size);
    }
    const view = this.last ? finishedView(this.last) : idleView(server.trusted, server.brief);
    return server.facts ? { ...view, tooltip: `${view.tooltip}\n\n${server.facts}` } : view;
  }
}

function idleView(trusted: boolean, brief: string | undefined): StatusView {
  if (!trusted) {
    return {
      text: "$(shield) HTAM: idle (restricted)",
      tooltip:
        "HTAM: Restricted Mode: kernels are parsed and explained, nothing is run. Trust the workspace to optimize.",
      running: false,
    };
  }
  const more = brief ? ` (${brief})` : "";
  return {
    text: `$(beaker) HTAM: idle${more}`,
    tooltip: "HTAM: no optimization running",
    running: false,
  };
}

function runningView(state: JobState, active: number): StatusView {
  const more = active > 1 ? ` (+${active - 1})` : "";
  const what = state.state === "queued" ? "queued" : state.steps > 0 ? stepLabel(state) : "running";
  return {
    text: `$(sync~spin) HTAM: ${what}${more}`,
    tooltip: `HTAM: ${state.kernel || state.uri}: ${progressMessage(state)} (click to cancel)`,
    running: true,
  };
}

function finishedView(state: JobState): StatusView {
  const subject = state.kernel || state.uri;
  const detail = state.message ? `: ${state.message}` : "";
  switch (state.state) {
    case "done": {
      const best =
        state.suggestions > 0 && state.bestSpeedup !== null
          ? formatSpeedup(state.bestSpeedup)
          : "nothing to apply";
      return {
        text: `$(check) HTAM: ${best}`,
        tooltip: `HTAM: ${subject} finished${detail}`,
        running: false,
      };
    }
    case "refused":
      return {
        text: "$(circle-slash) HTAM: refused",
        tooltip: `HTAM: ${subject}${detail}`,
        running: false,
      };
    default:
      return {
        text: `$(${state.state === "failed" ? "error" : "circle-slash"}) HTAM: ${state.state}`,
        tooltip: `HTAM: ${subject} ${state.state}${detail}`,
        running: false,
      };
  }
}
