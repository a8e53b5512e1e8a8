/**
 * One notification per job, with a Cancel button. vscode-languageclient shows the server's
 * work-done progress only in the status bar, so the extension draws this one itself.
 */
import * as vscode from "vscode";
import { isTerminal, type JobState, percent, progressMessage } from "./jobs";

type Report = vscode.Progress<{ message?: string; increment?: number }>;

class Notification {
  private done = 0;
  private reporter: Report | undefined;
  private pending: JobState;
  private finish: () => void = () => undefined;

  constructor(state: JobState, onCancel: () => void) {
    this.pending = state;
    void vscode.window.withProgress(
      {
        location: vscode.ProgressLocation.Notification,
        title: `HTAM ${state.kernel || "job"}`,
        cancellable: true,
      },
      (progress, token) => {
        token.onCancellationRequested(onCancel);
        this.reporter = progress;
        this.report(this.pending);
        return new Promise<void>((resolve) => {
          this.finish = resolve;
        });
      },
    );
  }

  report(state: JobState): void {
    this.pending = state;
    if (!this.reporter) {
      return;
    }
    const now = percent(state);
    this.reporter.report({ message: progressMessage(state), increment: now - this.done });
    this.done = now;
  }

  close(): void {
    this.finish();
  }
}

export class JobProgress {
  private readonly open = new Map<string, Notification>();

  update(state: JobState, onCancel: () => void): void {
    let notification = this.open.get(state.jobId);
    if (isTerminal(state)) {
      notification?.close();
      this.open.delete(state.jobId);
      return;
    }
    if (!notification) {
      notification = new Notification(state, onCancel);
      this.open.set(state.jobId, notification);
    }
    notification.report(state);
  }

  finishAll(): void {
    for (const notification of this.open.values()) {
      notification.close();
    }
    this.open.clear();
  }
}
