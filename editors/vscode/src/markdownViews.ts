/** Read-only Markdown documents for what Explain Kernel and Show Memory answer. */
import * as vscode from "vscode";

export class MarkdownViews implements vscode.TextDocumentContentProvider {
  static readonly scheme = "htam-view";
  private readonly contents = new Map<string, string>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.contents.get(uri.toString()) ?? "";
  }

  /** Shows `markdown` rendered beside the editor; a second call with the same title replaces it. */
  async show(title: string, markdown: string): Promise<void> {
    const uri = vscode.Uri.from({ scheme: MarkdownViews.scheme, path: `/HTAM ${title}.md` });
    this.contents.set(uri.toString(), markdown);
    this.changed.fire(uri);
    try {
      await vscode.commands.executeCommand("markdown.showPreviewToSide", uri);
    } catch {
      // No built-in Markdown extension (it can be disabled): show the source instead.
      const document = await vscode.workspace.openTextDocument(uri);
      await vscode.window.showTextDocument(document, vscode.ViewColumn.Beside);
    }
  }

  dispose(): void {
    this.changed.dispose();
  }
}
