import assert from "node:assert/strict";
import { test } from "node:test";
import { viewPage } from "../src/viewPage";

const SOURCE = "https://*.vscode-cdn.net";

test("the view's page runs no script, whatever the answer quotes", () => {
  const page = viewPage("<p>x</p><script>alert(1)</script>", SOURCE);
  const policy = /Content-Security-Policy" content="([^"]*)"/.exec(page)?.[1] ?? "";
  assert.match(policy, /default-src 'none'/);
  assert.doesNotMatch(policy, /script-src/);
  assert.match(policy, /img-src [^;]*data:/, "the results' plot is a data URI");
  assert.match(policy, new RegExp(`style-src ${SOURCE.replace(/[.*]/g, "\\$&")}`));
});

test("the view's page links the stylesheet it is given, and none without one", () => {
  const href = `${SOURCE}/media/markdown.css?a="b"`;
  const page = viewPage("<h1>HTAM</h1>", SOURCE, href);
  assert.match(page, /<link rel="stylesheet" href="[^"]*markdown\.css\?a=&quot;b&quot;">/);
  assert.match(page, /<body class="vscode-body"><h1>HTAM<\/h1><\/body>/);
  assert.doesNotMatch(viewPage("<h1>HTAM</h1>", SOURCE), /<link/);
});
