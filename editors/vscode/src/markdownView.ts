/** A read-only Markdown view for what Explain Kernel and Show Memory answer. */
import * as vscode from "vscode";

const OPEN_WAIT_MS = 3000;

export class MarkdownView implements vscode.TextDocumentContentProvider {
  static readonly scheme = "htam-view";
  /** One document, so each answer replaces the last in the same preview. */
  private readonly uri = vscode.Uri.from({ scheme: MarkdownView.scheme, path: "/HTAM.md" });
  private content = "";
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;

  provideTextDocumentContent(): string {
    return this.content;
  }

  /** Shows `markdown` rendered beside the editor, which keeps the focus. */
  async show(markdown: string): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    this.content = markdown;
    this.changed.fire(this.uri);
    if (this.isOpen()) {
      return; // the open preview follows the document's change
    }
    try {
      await vscode.commands.executeCommand("markdown.showPreviewToSide", this.uri);
    } catch {
      // No built-in Markdown extension (it can be disabled): show the source instead.
      const document = await vscode.workspace.openTextDocument(this.uri);
      await vscode.window.showTextDocument(document, {
        viewColumn: vscode.ViewColumn.Beside,
        preserveFocus: true,
      });
    }
    if (editor) {
      // The preview's tab (and the focus it takes) may come after the command returned.
      await this.opened();
      await vscode.window.showTextDocument(editor.document, editor.viewColumn, false);
    }
  }

  /** Resolves once the view's tab is open, or after OPEN_WAIT_MS. */
  private async opened(): Promise<void> {
    for (let waited = 0; waited < OPEN_WAIT_MS && !this.isOpen(); waited += 50) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Whether the preview (or, without the Markdown extension, the document) is open. */
  private isOpen(): boolean {
    const preview = `Preview ${this.uri.path.slice(1)}`;
    const source = this.uri.toString();
    return vscode.window.tabGroups.all.some((group) =>
      group.tabs.some(
        (tab) =>
          tab.label === preview ||
          (tab.input instanceof vscode.TabInputText && tab.input.uri.toString() === source),
      ),
    );
  }

  dispose(): void {
    this.changed.dispose();
  }
}
