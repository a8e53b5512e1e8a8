/** The HTAM extension: starts `htam-lsp`, completes palette commands, shows jobs and trust. */
import { readFile } from "node:fs/promises";
import { PythonExtension } from "@vscode/python-extension";
import * as vscode from "vscode";
import {
  type ClientCapabilities,
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  RevealOutputChannelOn,
  type ServerOptions,
  type StaticFeature,
} from "vscode-languageclient/node";
import {
  alreadyRunning,
  CommandError,
  commandArguments,
  type EditorContext,
  isInteractive,
  markdownOf,
  plotOf,
  SERVER_COMMANDS,
  stepsInputError,
  withInlinePlot,
} from "./commands";
import {
  API_KEY_VARIABLES,
  type HtamSettings,
  initializationOptions,
  isKeyProvider,
  KEY_PROVIDERS,
  type KeyProvider,
  serverEnvironment,
  withTrust,
} from "./config";
import {
  CHECKOUT,
  describe,
  existingInterpreter,
  findInterpreter,
  installCommand,
  installHint,
  interpreterCandidates,
  interpreterChoices,
  NOT_FOUND,
  PATH_NAMES,
  probeInterpreter,
  SERVER_ARGS,
  workspaceInterpreters,
} from "./interpreter";
import { isTerminal, JobTracker, type JobState, parseJobState, progressMessage } from "./jobs";
import { MarkdownView } from "./markdownView";
import { JobProgress } from "./progress";
import { parseStatus, type ServerStatus, statusBrief, statusTooltip } from "./status";

/**
 * The extension shows each job once: one notification with Cancel (from htam/jobState)
 * and the status item. Not advertising work-done progress keeps the server from sending
 * the same job a second time as $/progress, which VS Code would show in the status bar.
 */
const ONE_PROGRESS: StaticFeature = {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.window = { ...capabilities.window, workDoneProgress: false };
  },
  initialize: () => undefined,
  getState: () => ({ kind: "static" }),
  clear: () => undefined,
};

const DOCUMENTS = [
  { scheme: "file", language: "cuda-cpp" },
  { scheme: "file", language: "python" },
  { scheme: "untitled", language: "cuda-cpp" },
  { scheme: "untitled", language: "python" },
];

function settings(): HtamSettings {
  const config = vscode.workspace.getConfiguration("htam");
  return {
    provider: config.get("provider", "auto"),
    model: config.get("model", ""),
    baseUrl: config.get("baseUrl", ""),
    steps: config.get("steps", 6),
    device: config.get("device", "auto"),
    cassette: config.get("cassette", ""),
    minSpeedup: config.get("minSpeedup", 1.1),
    startAhead: config.get("startAhead", true),
  };
}

function interpreterSetting(): string {
  return vscode.workspace.getConfiguration("htam").get("interpreter", "");
}

function secretName(provider: KeyProvider): string {
  return `htam.apiKey.${provider}`;
}

/** Owns the one language client of this window and everything that reflects its state. */
class Htam implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private starting = false;
  /** The htam.interpreter value the running server was started with. */
  private interpreterSetting = "";
  /** Why the server is not running, when it is not. */
  private failure: string | undefined;
  /** A Python that exists here, for "Install htam Here" when none could run the server. */
  private installTarget: string | undefined;
  private unavailable: vscode.Disposable | undefined;
  private queue: Promise<void> = Promise.resolve();
  private readonly tracker = new JobTracker();
  private readonly progress = new JobProgress();
  private readonly status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  private readonly view = new MarkdownView();
  /** What the running server says it can do here (htam.status). */
  private serverStatus: ServerStatus | undefined;

  constructor(
    private readonly context: vscode.ExtensionContext,
    private readonly log: vscode.LogOutputChannel,
  ) {
    this.status.name = "HTAM";
    this.renderStatus();
    this.status.show();
  }

  /** Starts, stops and restarts run one after another. */
  restart(reason: string): Promise<void> {
    this.queue = this.queue.then(() => this.doRestart(reason));
    return this.queue;
  }

  async dispose(): Promise<void> {
    await this.stopClient();
    this.unavailable?.dispose();
    this.status.dispose();
    this.view.dispose();
  }

  viewProvider(): vscode.Disposable {
    return vscode.workspace.registerTextDocumentContentProvider(MarkdownView.scheme, this.view);
  }

  /** Restarts when the effective htam.interpreter changed (trust changes it too). */
  onConfigurationChanged(event: vscode.ConfigurationChangeEvent): void {
    if (event.affectsConfiguration("htam")) {
      void this.refreshStatus(); // the server validates; its problems show in the tooltip
    }
    if (
      event.affectsConfiguration("htam.interpreter") &&
      interpreterSetting() !== this.interpreterSetting
    ) {
      void this.restart("htam.interpreter changed");
    }
  }

  async optimizeN(): Promise<void> {
    const steps = await vscode.window.showInputBox({
      title: "HTAM: Optimize",
      prompt: "How many steps?",
      value: String(settings().steps),
      validateInput: stepsInputError,
    });
    if (steps === undefined) {
      return;
    }
    const args = this.completeArguments("htam.optimize", [], Number(steps.trim()));
    if (args) {
      await vscode.commands.executeCommand("htam.optimize", ...args);
    }
  }

  async setApiKey(): Promise<void> {
    const provider = await vscode.window.showQuickPick(KEY_PROVIDERS, {
      title: "HTAM: Set API Key",
      placeHolder: "Provider whose key to keep in VS Code's SecretStorage",
    });
    if (!provider || !isKeyProvider(provider)) {
      return;
    }
    const key = await vscode.window.showInputBox({
      title: `HTAM: ${provider} API key`,
      prompt: `Kept in SecretStorage and given to htam-lsp as ${API_KEY_VARIABLES[provider]}; empty removes it.`,
      password: true,
      ignoreFocusOut: true,
    });
    if (key === undefined) {
      return;
    }
    if (key.trim()) {
      await this.context.secrets.store(secretName(provider), key.trim());
    } else {
      await this.context.secrets.delete(secretName(provider));
    }
    await this.restart(`API key for ${provider} ${key.trim() ? "stored" : "removed"}`);
  }

  private async doRestart(reason: string): Promise<void> {
    this.log.info(`Starting htam-lsp: ${reason}`);
    await this.stopClient();
    this.starting = true;
    this.failure = undefined;
    this.renderStatus();
    try {
      await this.startClient();
    } catch (error) {
      this.client = undefined;
      this.fail(`HTAM: htam-lsp failed to start: ${oneLine(error)}`);
    } finally {
      this.starting = false;
      this.renderStatus();
    }
  }

  private async startClient(): Promise<void> {
    const trusted = vscode.workspace.isTrusted;
    this.interpreterSetting = interpreterSetting();
    const candidates = interpreterCandidates({
      setting: this.interpreterSetting,
      pythonExtension: trusted ? await this.pythonExtensionInterpreter() : undefined,
      trusted,
      platform: process.platform,
    });
    const { found, failures } = await findInterpreter(candidates);
    if (!found) {
      const commands = [...candidates.map((candidate) => candidate.command), ...PATH_NAMES];
      this.installTarget = await existingInterpreter(commands);
      this.fail(installHint(candidates, failures, this.installTarget));
      return;
    }
    this.log.info(`Interpreter: ${describe(found)}; workspace trusted: ${trusted}`);
    const serverOptions: ServerOptions = {
      command: found.command,
      args: SERVER_ARGS,
      options: { env: serverEnvironment(process.env, await this.storedKeys()) },
    };
    const client = new LanguageClient("htam", "HTAM", serverOptions, this.clientOptions(trusted));
    client.onNotification("htam/jobState", (payload: unknown) => this.onJobState(payload));
    client.registerFeature(ONE_PROGRESS);
    this.unavailable?.dispose();
    this.unavailable = undefined;
    this.client = client;
    await client.start();
    await this.refreshStatus();
  }

  /** Asks the server what it can do here; the status item shows its answer. */
  private async refreshStatus(): Promise<void> {
    const client = this.client;
    if (!client) {
      return;
    }
    try {
      const params = { command: "htam.status", arguments: [{}] };
      const answer: unknown = await client.sendRequest(ExecuteCommandRequest.type, params);
      this.serverStatus = parseStatus(answer);
      this.log.info(`htam.status: ${JSON.stringify(answer)}`);
    } catch (error) {
      this.serverStatus = undefined;
      this.log.warn(`htam.status failed: ${String(error)}`);
    }
    this.renderStatus();
  }

  private clientOptions(trusted: boolean): LanguageClientOptions {
    return {
      documentSelector: DOCUMENTS,
      outputChannel: this.log,
      // A request that fails (one sent to a client being restarted: "Starting server
      // failed") goes to the log, not to a stack-trace toast; the server's own messages,
      // the job notifications and a crash ("force") still reach the user.
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      // Our own one-line message (with what to do) instead of the client's stack trace.
      initializationFailedHandler: (error) => {
        this.log.error(`htam-lsp did not initialize: ${String(error)}`);
        return false;
      },
      initializationOptions: initializationOptions(settings(), trusted),
      synchronize: { configurationSection: "htam" },
      middleware: {
        executeCommand: (command, args, next) => this.executeCommand(command, args, next),
        workspace: {
          // A changed htam.interpreter restarts the server instead; a server that is not
          // running (stopping, or failed to start) hears nothing: neither is worth a toast.
          didChangeConfiguration: async (sections, next) => {
            if (!this.client?.isRunning() || interpreterSetting() !== this.interpreterSetting) {
              return;
            }
            try {
              await next(sections);
            } catch (error) {
              this.log.warn(`workspace/didChangeConfiguration not sent: ${oneLine(error)}`);
            }
          },
          configuration: async (params, token, next) => {
            const results = await next(params, token);
            if (!Array.isArray(results)) {
              return results;
            }
            const sections = params.items.map((item) => item.section);
            return withTrust(sections, results, vscode.workspace.isTrusted);
          },
        },
      },
    };
  }

  private async stopClient(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.serverStatus = undefined;
    this.tracker.clear();
    this.progress.finishAll();
    this.renderStatus();
    if (client) {
      try {
        await client.stop(5000);
      } catch (error) {
        this.log.warn(`htam-lsp did not stop cleanly: ${String(error)}`);
      }
    }
  }

  /** Without a server its commands do not exist; these say why instead of "not found". */
  private fail(message: string): void {
    this.log.error(message);
    this.unavailable?.dispose();
    this.unavailable = vscode.Disposable.from(
      ...SERVER_COMMANDS.map((id) =>
        vscode.commands.registerCommand(id, () => vscode.window.showErrorMessage(message)),
      ),
    );
    this.failure = message;
    const choices = ["Choose Interpreter", "Install htam Here", "Open Settings", "Show Log"];
    void vscode.window.showErrorMessage(message, ...choices).then((choice) => {
      if (choice === "Choose Interpreter") {
        void this.chooseInterpreter();
      } else if (choice === "Install htam Here") {
        this.installHere();
      } else if (choice === "Open Settings") {
        // `@id:` finds the setting in remote windows (code-server) too.
        void vscode.commands.executeCommand(
          "workbench.action.openSettings",
          "@id:htam.interpreter",
        );
      } else if (choice === "Show Log") {
        this.log.show();
      }
    });
  }

  /**
   * A quick pick of the interpreters here, those that can run htam-lsp first, and a row to
   * enter a path. Choosing one that cannot offers to install htam into it.
   */
  async chooseInterpreter(): Promise<void> {
    const setting = interpreterSetting();
    const commands = [
      ...(setting ? [setting] : []),
      ...(await this.knownInterpreters()),
      ...(vscode.workspace.isTrusted ? this.workspaceVenvs() : []),
      ...PATH_NAMES,
    ];
    const probed = await Promise.all(
      commands.map(async (command) => ({ command, result: await probeInterpreter(command) })),
    );
    const enter = { label: ENTER_PATH, description: "a Python that has htam installed", ok: false };
    const rows = [...interpreterChoices(probed).filter((row) => row.ok || !isMissing(row)), enter];
    const picked = await vscode.window.showQuickPick(rows, {
      title: "HTAM: interpreter for htam-lsp",
      placeHolder: "Interpreters that can import htam_lsp come first",
    });
    if (!picked) {
      return;
    }
    const command = picked === enter ? await this.enterInterpreter() : picked.label;
    if (!command) {
      return;
    }
    const ok = picked === enter || picked.ok;
    if (!ok) {
      this.installHere(command);
      return;
    }
    // Global: VS Code keeps a machine-overridable setting with the remote machine's
    // settings in a remote window (code-server), where the server runs.
    const config = vscode.workspace.getConfiguration("htam");
    await config.update("interpreter", command, vscode.ConfigurationTarget.Global);
    if (interpreterSetting() !== command) {
      void vscode.window.showWarningMessage(
        `HTAM: htam.interpreter is still ${interpreterSetting()}: a workspace setting overrides it.`,
      );
    }
    await this.restart(`interpreter chosen: ${command}`);
  }

  /** An interpreter path typed by the user, if it can run htam-lsp (else says why). */
  private async enterInterpreter(): Promise<string | undefined> {
    const typed = await vscode.window.showInputBox({
      title: "HTAM: interpreter for htam-lsp",
      prompt: "Path to a Python interpreter that has htam installed",
      placeHolder: "/path/to/venv/bin/python",
      ignoreFocusOut: true,
    });
    const command = typed?.trim();
    if (!command) {
      return undefined;
    }
    const result = await probeInterpreter(command);
    if (result.ok) {
      return command;
    }
    const choice = await vscode.window.showErrorMessage(
      `HTAM: ${command} cannot run htam-lsp: ${result.detail}`,
      "Install htam Here",
    );
    if (choice) {
      this.installHere(command);
    }
    return undefined;
  }

  private workspaceVenvs(): string[] {
    const folders = (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath);
    return workspaceInterpreters(folders, process.platform);
  }

  /** A terminal with the command that installs htam into `python` from a checkout (the user
   * names the checkout, then runs pip). */
  private installHere(python = this.installTarget ?? "python3"): void {
    const terminal = vscode.window.createTerminal({ name: "HTAM: install" });
    terminal.show();
    terminal.sendText(installCommand(python), false);
    void vscode.window.showInformationMessage(
      `HTAM: in the terminal, replace ${CHECKOUT} with your HTAM checkout and press Enter to ` +
        "run pip, then HTAM: Restart Server.",
    );
  }

  private async knownInterpreters(): Promise<string[]> {
    if (!vscode.extensions.getExtension("ms-python.python")) {
      return [];
    }
    try {
      const api = await PythonExtension.api();
      return api.environments.known
        .map((env) => env.executable.uri?.fsPath)
        .filter((path): path is string => typeof path === "string");
    } catch (error) {
      this.log.warn(`The Python extension listed no environments: ${String(error)}`);
      return [];
    }
  }

  private async pythonExtensionInterpreter(): Promise<string | undefined> {
    if (!vscode.extensions.getExtension("ms-python.python")) {
      return undefined;
    }
    try {
      const api = await PythonExtension.api();
      const resource = vscode.workspace.workspaceFolders?.[0]?.uri;
      const active = api.environments.getActiveEnvironmentPath(resource);
      const resolved = await api.environments.resolveEnvironment(active);
      return resolved?.executable.uri?.fsPath;
    } catch (error) {
      this.log.warn(`The Python extension gave no interpreter: ${String(error)}`);
      return undefined;
    }
  }

  private async storedKeys(): Promise<Partial<Record<KeyProvider, string>>> {
    const keys: Partial<Record<KeyProvider, string>> = {};
    for (const provider of KEY_PROVIDERS) {
      const key = await this.context.secrets.get(secretName(provider));
      if (key) {
        keys[provider] = key;
      }
    }
    return keys;
  }

  private editorContext(steps: number): EditorContext {
    const editor = vscode.window.activeTextEditor;
    const context: EditorContext = { steps };
    const job = this.tracker.current();
    if (job) {
      context.jobId = job.jobId;
    }
    if (editor && this.client) {
      context.uri = this.client.code2ProtocolConverter.asUri(editor.document.uri);
      const { line, character } = editor.selection.active;
      context.position = { line, character };
    }
    return context;
  }

  /** The arguments to send, or `undefined` after telling the user what is missing. */
  private completeArguments(
    command: string,
    args: unknown[],
    steps: number,
  ): unknown[] | undefined {
    try {
      return commandArguments(command, args, this.editorContext(steps));
    } catch (error) {
      if (error instanceof CommandError) {
        void vscode.window.showWarningMessage(error.message);
        return undefined;
      }
      throw error;
    }
  }

  private async executeCommand(
    command: string,
    args: unknown[],
    next: (command: string, args: unknown[]) => vscode.ProviderResult<unknown>,
  ): Promise<unknown> {
    const full = this.completeArguments(command, args, settings().steps);
    if (!full) {
      return undefined;
    }
    this.log.info(`${command} ${JSON.stringify(full)}`);
    if (!isInteractive(args) || !this.client) {
      return next(command, full);
    }
    // From the palette: the server's own message is the one to show (for example "put the
    // cursor in a kernel"), not the client's generic "request failed".
    try {
      const params = { command, arguments: full };
      const result: unknown = await this.client.sendRequest(ExecuteCommandRequest.type, params);
      const markdown = markdownOf(result);
      if (markdown !== undefined) {
        await this.view.show(await this.inlinePlot(markdown, plotOf(result)));
      }
      const notice = alreadyRunning(result);
      if (notice) {
        void vscode.window.showInformationMessage(notice);
      }
    } catch (error) {
      this.log.error(`${command} failed: ${String(error)}`);
      void vscode.window.showErrorMessage(error instanceof Error ? error.message : String(error));
    }
    return undefined;
  }

  /** The results' plot as a data URI (the server runs where this extension host does). */
  private async inlinePlot(markdown: string, plot: string | undefined): Promise<string> {
    if (!plot) {
      return markdown;
    }
    try {
      return withInlinePlot(markdown, await readFile(plot));
    } catch (error) {
      this.log.warn(`The speedup plot ${plot} could not be read: ${String(error)}`);
      return markdown;
    }
  }

  private onJobState(payload: unknown): void {
    const state = parseJobState(payload);
    if (!state) {
      this.log.warn(`Ignored a malformed htam/jobState: ${JSON.stringify(payload)}`);
      return;
    }
    this.log.info(`job ${state.jobId} ${state.kernel}: ${state.state} ${progressMessage(state)}`);
    this.tracker.update(state);
    this.renderStatus();
    this.progress.update(state, () => this.cancel(state.jobId));
    if (isTerminal(state)) {
      this.announce(state);
      void this.refreshStatus(); // a job's own provider choice may differ from the guess
    }
  }

  private cancel(jobId: string): void {
    void vscode.commands.executeCommand("htam.cancel", { jobId });
  }

  /** One message when a job ends, in the server's words (the engine's own reason). */
  private announce(state: JobState): void {
    const subject = state.kernel || state.uri;
    const said = `HTAM: ${subject}: ${state.message || state.state}`;
    if (state.state === "failed") {
      void vscode.window.showErrorMessage(said);
    } else if (state.state === "refused") {
      // The reason comes first: a long toast shows only its first line.
      void vscode.window.showWarningMessage(`HTAM: ${state.message || "refused"}`);
    } else if (state.state === "done" && state.suggestions > 0) {
      void vscode.window.showInformationMessage(said, "Show Actions").then((choice) => {
        if (choice) {
          void vscode.commands.executeCommand("editor.action.refactor");
        }
      });
    } else if (state.state === "done") {
      void vscode.window.showInformationMessage(said);
    }
  }

  private renderStatus(): void {
    if (this.failure && !this.starting) {
      this.status.text = "$(error) HTAM: not running";
      this.status.tooltip = this.failure;
      this.status.command = "htam.showLog";
      return;
    }
    const status = this.serverStatus;
    const server = { starting: this.starting, trusted: vscode.workspace.isTrusted };
    const view = this.tracker.view(
      status ? { ...server, brief: statusBrief(status), facts: statusTooltip(status) } : server,
    );
    this.status.text = view.text;
    this.status.tooltip = view.tooltip;
    this.status.command = view.running ? "htam.cancel" : "htam.showLog";
  }
}

const ENTER_PATH = "$(folder) Enter interpreter path...";

/** A quick pick row of an interpreter that does not exist here (not worth showing). */
function isMissing(row: { description: string }): boolean {
  return row.description.startsWith(`cannot: ${NOT_FOUND}`);
}

/** An error's message on one line: never a stack trace in a toast (the log has it). */
function oneLine(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.split(/\r?\n/)[0] ?? message;
}

let htam: Htam | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel("HTAM", { log: true });
  const instance = new Htam(context, log);
  htam = instance;
  context.subscriptions.push(
    log,
    instance.viewProvider(),
    vscode.commands.registerCommand("htam.restartServer", () =>
      instance.restart("restart requested"),
    ),
    vscode.commands.registerCommand("htam.setApiKey", () => instance.setApiKey()),
    vscode.commands.registerCommand("htam.optimizeN", () => instance.optimizeN()),
    vscode.commands.registerCommand("htam.showLog", () => log.show()),
    vscode.commands.registerCommand("htam.chooseInterpreter", () => instance.chooseInterpreter()),
    vscode.workspace.onDidGrantWorkspaceTrust(() =>
      instance.restart("workspace trusted: execution allowed"),
    ),
    vscode.workspace.onDidChangeConfiguration((event) => instance.onConfigurationChanged(event)),
  );
  await instance.restart("activation");
}

export async function deactivate(): Promise<void> {
  await htam?.dispose();
  htam = undefined;
}
