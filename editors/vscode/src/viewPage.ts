/** The page HTAM's own Markdown view shows (no `vscode`, so it is unit-tested). */

/**
 * A page for `body`, HTML the built-in Markdown engine rendered from the server's answer.
 * The answer quotes the user's files, so the page runs no script at all (the policy has no
 * script-src): only styles from `cspSource` and images inlined as data URIs load.
 */
export function viewPage(body: string, cspSource: string, stylesheet?: string): string {
  const policy = [
    "default-src 'none'",
    `style-src ${cspSource} 'unsafe-inline'`,
    `img-src ${cspSource} data:`,
    `font-src ${cspSource}`,
  ].join("; ");
  const link = stylesheet ? `<link rel="stylesheet" href="${escapeAttribute(stylesheet)}">` : "";
  return [
    "<!DOCTYPE html>",
    '<html lang="en"><head><meta charset="UTF-8">',
    `<meta http-equiv="Content-Security-Policy" content="${policy}">`,
    link,
    "</head>",
    `<body class="vscode-body">${body}</body></html>`,
  ].join("\n");
}

function escapeAttribute(value: string): string {
  return value.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");
}
