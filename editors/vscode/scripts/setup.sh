#!/usr/bin/env bash
# Installs what the VS Code extension and its end-to-end test need, idempotently:
# Node 24, the extension's npm packages, the bundle and htam.vsix, the system packages,
# Chromium and code-server. A warm machine finishes in seconds (stamps and checks).
#
# A step that fails is written to .tools/vscode-setup-failed. Locally the script still
# exits 0 and the end-to-end test skips naming it; in CI (CI=true) it exits 1. Run from anywhere: bash editors/vscode/scripts/setup.sh
#
# `--vsix-only`: only what building htam.vsix needs (Node 24, npm packages, the bundle), for
# a user who installs the extension into their own VS Code; no Chromium, no code-server.
set -uo pipefail

VSIX_ONLY=false
[[ "${1:-}" == "--vsix-only" ]] && VSIX_ONLY=true

EXT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "$EXT_DIR/../.." && pwd)"
TOOLS="$REPO/.tools"
FAILED="$TOOLS/vscode-setup-failed"
CODE_SERVER_VERSION="4.139.1"
CODE_SERVER_DIR="$TOOLS/code-server"
NODE_DIR="$TOOLS/node"
APT_PACKAGES=(build-essential pkg-config libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev chromium)

mkdir -p "$TOOLS"
rm -f "$FAILED"

log() { echo "htam setup: $*" >&2; }

# Records a failed step and its reason; later steps that need it are skipped.
fail() {
  log "FAILED: $1"
  echo "$1" >>"$FAILED"
  return 1
}

# Runs a command quietly, keeping its output in a log that a failure points to.
quiet() {
  local name="$1"
  shift
  local out="$TOOLS/setup-$name.log"
  if "$@" >"$out" 2>&1; then
    return 0
  fi
  tail -n 20 "$out" >&2
  return 1
}

node_major() { "${1:-node}" --version 2>/dev/null | sed -n 's/^v\([0-9]*\).*/\1/p'; }

ensure_node() {
  if [[ "$(node_major)" == "24" ]]; then
    return 0
  fi
  local bin="$NODE_DIR/node_modules/node/bin"
  if [[ "$(node_major "$bin/node")" != "24" ]]; then
    command -v npm >/dev/null || { fail "node: neither Node.js 24 nor npm is on PATH"; return 1; }
    log "installing Node.js 24 into $NODE_DIR"
    mkdir -p "$NODE_DIR"
    quiet node npm install --prefix "$NODE_DIR" --no-audit --no-fund node@24 \
      || { fail "node: npm install node@24 failed (see $TOOLS/setup-node.log)"; return 1; }
  fi
  export PATH="$bin:$PATH"
}

# npm ci only when package-lock.json changed since the last successful install.
ensure_extension_packages() {
  local stamp="$EXT_DIR/node_modules/.htam-lock.sha"
  local want
  want="$(sha256sum "$EXT_DIR/package-lock.json" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  log "npm ci in editors/vscode"
  (cd "$EXT_DIR" && quiet npm-ci npm ci --no-audit --no-fund) \
    || { fail "npm ci: installing the extension's packages failed (see $TOOLS/setup-npm-ci.log)"; return 1; }
  echo "$want" >"$stamp"
}

# Bundles and packages only when a source is newer than htam.vsix.
ensure_vsix() {
  local vsix="$EXT_DIR/htam.vsix"
  if [[ -f "$vsix" ]] && [[ -z "$(cd "$EXT_DIR" && find src package.json package-lock.json README.md .vscodeignore tsconfig.json -newer "$vsix" -print -quit)" ]]; then
    return 0
  fi
  log "bundling and packaging htam.vsix"
  (cd "$EXT_DIR" && quiet vsce npm run package) \
    || { fail "vsce package: building htam.vsix failed (see $TOOLS/setup-vsce.log)"; return 1; }
}

ensure_apt_packages() {
  local missing=()
  for package in "${APT_PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    return 0
  fi
  local sudo=()
  [[ "$(id -u)" == "0" ]] || sudo=(sudo -n)
  log "apt-get install ${missing[*]}"
  quiet apt-update "${sudo[@]}" apt-get update -q \
    && quiet apt-install "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
    || { fail "apt-get: installing ${missing[*]} failed (see $TOOLS/setup-apt-*.log)"; return 1; }
}

# npm 11 skips dependencies' install scripts unless package.json allows them;
# code-server's postinstall installs VS Code's own modules, so it must run.
ensure_code_server() {
  local bin="$CODE_SERVER_DIR/node_modules/.bin/code-server"
  if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "^$CODE_SERVER_VERSION "; then
    return 0
  fi
  log "installing code-server $CODE_SERVER_VERSION (a few minutes)"
  mkdir -p "$CODE_SERVER_DIR"
  cat >"$CODE_SERVER_DIR/package.json" <<EOF
{"private": true, "dependencies": {"code-server": "$CODE_SERVER_VERSION"},
 "allowScripts": {"code-server": true, "argon2": true}}
EOF
  (cd "$CODE_SERVER_DIR" && quiet code-server npm install --no-audit --no-fund) \
    && "$bin" --version >/dev/null 2>&1 \
    || { fail "code-server: npm install code-server@$CODE_SERVER_VERSION failed (see $TOOLS/setup-code-server.log)"; return 1; }
}

ensure_playwright() {
  local python="$REPO/.venv/bin/python"
  [[ -x "$python" ]] || python="python3"
  "$python" -c "import playwright" 2>/dev/null \
    || fail "playwright: the Python package is missing (pip install -e '.[dev]')"
}

if [[ "$VSIX_ONLY" == "true" ]]; then
  if ensure_node && ensure_extension_packages && ensure_vsix; then
    log "ready: $EXT_DIR/htam.vsix (install it: code --install-extension $EXT_DIR/htam.vsix)"
    exit 0
  fi
  exit 1
fi
if ensure_node; then
  ensure_extension_packages && ensure_vsix
  ensure_apt_packages && ensure_code_server
fi
ensure_playwright

if [[ -f "$FAILED" ]]; then
  log "some steps failed; the VS Code end-to-end test will skip: $(tr '\n' ' ' <"$FAILED")"
  [[ "${CI:-}" == "true" ]] && exit 1
else
  log "ready: $EXT_DIR/htam.vsix, code-server $CODE_SERVER_VERSION, /usr/bin/chromium"
fi
exit 0
