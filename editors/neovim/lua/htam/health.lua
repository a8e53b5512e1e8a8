--- `:checkhealth htam`
local config = require('htam.config')

local M = {}

local h = vim.health

-- Modules the server needs, imported by the server's own interpreter.
local PROBE = [[
import importlib, json
result = {}
for name in ("htam_lsp", "tree_sitter_cuda", "tree_sitter_python"):
    try:
        importlib.import_module(name)
        result[name] = None
    except Exception as error:
        result[name] = f"{type(error).__name__}: {error}"
print(json.dumps(result))
]]

---@param name string
---@return string the full path where `name` is on $PATH, else `name`
local function resolve(name)
  local path = vim.fn.exepath(name)
  return path ~= '' and path or name
end

--- The interpreter that runs `exe`: itself, or the one named by its `#!` line.
---@param exe string
---@return string
local function python_of(exe)
  if vim.fs.basename(exe):match('^python') then
    return exe
  end
  local file = io.open(exe, 'r')
  local first = file and file:read('*l') or ''
  if file then
    file:close()
  end
  if first:sub(1, 2) ~= '#!' then
    return resolve('python3')
  end
  local words = vim.split(first:sub(3), '%s+', { trimempty = true })
  if words[1] and vim.fs.basename(words[1]) == 'env' then
    table.remove(words, 1)
  end
  if words[1] and vim.fs.basename(words[1]):match('^python') then
    return resolve(words[1])
  end
  return resolve('python3')
end

---@param env? table<string, string>
---@param name string
---@return string?
local function getenv(env, name)
  local value = (env and env[name]) or vim.env[name]
  return (value ~= nil and value ~= '') and value or nil
end

local function check_neovim()
  h.start('Neovim')
  local v = vim.version()
  local version = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.11') == 1 then
    h.ok('Neovim ' .. version)
  else
    h.error(('Neovim %s is too old'):format(version), 'HTAM needs Neovim 0.11+ (vim.lsp.config)')
  end
end

---@param python string
---@param env? table<string, string>
local function check_imports(python, env)
  local started, run = pcall(function()
    return vim.system({ python, '-c', PROBE }, { text = true, env = env }):wait(30000)
  end)
  local decoded, found = pcall(vim.json.decode, started and run.stdout or '')
  if not started or run.code ~= 0 or not decoded or type(found) ~= 'table' then
    local why = started and vim.trim(run.stderr or '') or tostring(run)
    h.error(('%s could not run the import check: %s'):format(python, why))
    return
  end
  local advice = {
    htam_lsp = 'install HTAM into that environment: pip install htam',
    tree_sitter_cuda = 'pip install tree-sitter-cuda',
    tree_sitter_python = 'pip install tree-sitter-python',
  }
  for _, name in ipairs({ 'htam_lsp', 'tree_sitter_cuda', 'tree_sitter_python' }) do
    if found[name] == vim.NIL or found[name] == nil then
      h.ok(('`%s` imports in %s'):format(name, python))
    else
      h.error(('`%s` does not import in %s: %s'):format(name, python, found[name]), advice[name])
    end
  end
end

---@param cfg vim.lsp.Config
local function check_server(cfg)
  h.start('Language server')
  if not vim.lsp.is_enabled('htam') then
    h.warn("vim.lsp.enable('htam') has not been called", "add it to your config")
  end
  local cmd = cfg.cmd
  if type(cmd) ~= 'table' or type(cmd[1]) ~= 'string' then
    h.info('cmd is a function: the executable and its imports are not checked')
    return
  end
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    h.error(
      ('`%s` is not executable or not on $PATH'):format(cmd[1]),
      {
        'pip install htam (it provides htam-lsp)',
        "or require('htam').setup({ cmd = { '/path/to/htam-lsp' } })",
      }
    )
    return
  end
  h.ok(('server: %s'):format(table.concat(vim.list_extend({ exe }, vim.list_slice(cmd, 2)), ' ')))
  check_imports(python_of(exe), cfg.cmd_env)
  for _, client in ipairs(vim.lsp.get_clients({ name = 'htam' })) do
    h.info(('running: client %d, root %s'):format(client.id, client.root_dir or '(none)'))
  end
end

-- Where each provider finds its credentials or endpoint (values are never shown).
local SOURCES = {
  anthropic = { 'ANTHROPIC_API_KEY' },
  openai = { 'OPENAI_API_KEY', 'HTAM_LLM_BASE_URL', 'base_url' },
  auto = { 'ANTHROPIC_API_KEY', 'OPENAI_API_KEY', 'HTAM_LLM_BASE_URL', 'base_url' },
}

---@param o htam.Options
---@param env? table<string, string>
---@return 'ok'|'warn'|'error' level, string message, string? advice
local function provider_status(o, env)
  if o.provider == 'offline' then
    return 'ok', 'offline: mechanical strategies only, no LLM'
  end
  if o.provider == 'replay' then
    if not o.cassette then
      return 'error', 'provider = "replay" needs a cassette', "setup({ cassette = 'run.jsonl' })"
    end
    if vim.fn.filereadable(vim.fn.fnamemodify(o.cassette, ':p')) == 0 then
      return 'error', ('the cassette %s is not readable'):format(o.cassette)
    end
    return 'ok', 'replay from ' .. o.cassette
  end
  local found = vim.tbl_filter(function(name)
    return (name == 'base_url' and o.base_url) or getenv(env, name) ~= nil
  end, SOURCES[o.provider])
  local model = o.model and (' (' .. o.model .. ')') or ''
  if #found > 0 then
    return 'ok', ('%s%s: %s set'):format(o.provider, model, table.concat(found, ', '))
  end
  local wanted = table.concat(SOURCES[o.provider], ' or ')
  if o.provider == 'auto' then
    return 'warn', 'auto: no LLM configured, so only mechanical strategies run', 'set ' .. wanted
  end
  return 'error', ('provider = "%s" but none of %s is set'):format(o.provider, wanted)
end

---@param env? table<string, string>
local function check_provider(env)
  h.start('LLM provider')
  local level, message, advice = provider_status(config.options, env)
  h[level](message, advice)
end

local function check_device()
  h.start('Device')
  local device = config.options.device
  local gpu
  if vim.fn.executable('nvidia-smi') == 1 then
    local run = vim.system({ 'nvidia-smi', '-L' }, { text = true }):wait(10000)
    if run.code == 0 and vim.trim(run.stdout or '') ~= '' then
      gpu = vim.split(vim.trim(run.stdout), '\n')[1]
    end
  end
  if gpu then
    h.ok(('GPU: %s (device = %s)'):format(gpu, device))
  elseif device == 'cuda' then
    h.error('device = "cuda" but nvidia-smi finds no NVIDIA GPU', 'use device = "auto" or "cpu"')
  else
    h.ok(('no GPU found: candidates are evaluated on the CPU (device = %s)'):format(device))
  end
end

local function check_execution()
  h.start('Execution')
  if config.options.allow_execution then
    h.ok('allowed: generated code is compiled and run in isolated workers')
  else
    h.warn(
      'off: :HtamNext and :HtamOptimize refuse to run generated code',
      "opt in with require('htam').setup({ allow_execution = true })"
    )
  end
end

function M.check()
  local cfg = vim.lsp.config.htam or {}
  check_neovim()
  check_server(cfg)
  check_provider(cfg.cmd_env)
  check_device()
  check_execution()
end

return M
