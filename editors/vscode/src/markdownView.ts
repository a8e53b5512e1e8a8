/** A read-only Markdown view for what Explain Kernel, Show Memory and Results answer. */
import * as vscode from "vscode";
import { viewPage } from "./viewPage";

/** The built-in extension whose engine renders the view and whose stylesheet styles it. */
const MARKDOWN_EXTENSION = "vscode.markdown-language-features";

export class MarkdownView implements vscode.TextDocumentContentProvider {
  static readonly scheme = "htam-view";
  /** The source, shown as a document when the built-in Markdown extension is disabled. */
  private readonly uri = vscode.Uri.from({ scheme: MarkdownView.scheme, path: "/HTAM.md" });
  private content = "";
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;
  /** One panel, so each answer replaces the last in the same view. */
  private panel: vscode.WebviewPanel | undefined;

  provideTextDocumentContent(): string {
    return this.content;
  }

  /** Shows `markdown` beside the editor, which keeps the focus. */
  async show(markdown: string): Promise<void> {
    this.content = markdown;
    this.changed.fire(this.uri);
    const html = await render(markdown);
    if (html === undefined) {
      await this.showSource();
    } else {
      this.showRendered(html);
    }
  }

  /**
   * Our own panel, opened with preserveFocus: the built-in preview would open focused, and
   * taking the focus back raced the preview's own late focus on a busy machine.
   */
  private showRendered(html: string): void {
    const styles = vscode.extensions.getExtension(MARKDOWN_EXTENSION)?.extensionUri;
    const media = styles && vscode.Uri.joinPath(styles, "media");
    if (!this.panel) {
      this.panel = vscode.window.createWebviewPanel(
        "htam.view",
        "HTAM",
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
        { enableFindWidget: true, localResourceRoots: media ? [media] : [] },
      );
      this.panel.onDidDispose(() => (this.panel = undefined));
    } else if (!this.panel.visible) {
      this.panel.reveal(undefined, true);
    }
    const webview = this.panel.webview;
    const stylesheet = media && webview.asWebviewUri(vscode.Uri.joinPath(media, "markdown.css"));
    webview.html = viewPage(html, webview.cspSource, stylesheet?.toString());
  }

  private async showSource(): Promise<void> {
    const document = await vscode.workspace.openTextDocument(this.uri);
    await vscode.window.showTextDocument(document, {
      viewColumn: vscode.ViewColumn.Beside,
      preserveFocus: true,
    });
  }

  dispose(): void {
    this.panel?.dispose();
    this.changed.dispose();
  }
}

/** HTML from the built-in Markdown engine; undefined when that extension is disabled. */
async function render(markdown: string): Promise<string | undefined> {
  try {
    return await vscode.commands.executeCommand<string>("markdown.api.render", markdown);
  } catch {
    return undefined;
  }
}
