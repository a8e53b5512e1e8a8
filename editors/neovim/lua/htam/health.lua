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
        # the server's own module: its imports (pygls, lsprotocol) fail here as they would
        importlib.import_module("htam_lsp.server" if name == "htam_lsp" else name)
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

--- Why the server command `cmd` cannot run htam-lsp, in one line; nil when it looks fine
--- (or is a function). Used when the server exited at once, to say why plainly.
---@param cmd any
---@param env? table<string, string>
---@return string?
function M.server_problem(cmd, env)
  if type(cmd) ~= 'table' or type(cmd[1]) ~= 'string' then
    return nil
  end
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    return ('`%s` is not an executable on $PATH'):format(cmd[1])
  end
  local python = python_of(exe)
  local started, run = pcall(function()
    return vim.system({ python, '-c', PROBE }, { text = true, env = env }):wait(15000)
  end)
  local decoded, found = pcall(vim.json.decode, started and run.stdout or '')
  if not started or run.code ~= 0 or not decoded or type(found) ~= 'table' then
    local lines = vim.split(vim.trim(started and run.stderr or tostring(run)), '\n')
    return ('%s could not run: %s'):format(python, lines[#lines])
  end
  local error = found.htam_lsp
  if error ~= nil and error ~= vim.NIL then
    return ('`htam_lsp` does not import in %s: %s (install it: %s, '
      .. 'or setup({ cmd = { "/path/to/htam-lsp" } }))'):format(
      python,
      error,
      config.install_command(python)
    )
  end
  return nil
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
    htam_lsp = 'install HTAM into the server\'s Python: ' .. config.install_command(python),
    tree_sitter_cuda = ('%s -m pip install tree-sitter-cuda'):format(python),
    tree_sitter_python = ('%s -m pip install tree-sitter-python'):format(python),
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
        config.install_command('python3') .. ' (it provides htam-lsp)',
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

--- The server's own `htam.status` (a running client's, else nil and why).
---@return table?, string?
local function server_status()
  local client = vim.lsp.get_clients({ name = 'htam' })[1]
  if not client then
    return nil, 'no htam-lsp is running: open a kernel file to see what it can do here'
  end
  local params = { command = 'htam.status', arguments = { vim.empty_dict() } }
  local reply, err = client:request_sync('workspace/executeCommand', params, 40000)
  if not reply or reply.err or type(reply.result) ~= 'table' then
    local why = err or (reply and reply.err and reply.err.message) or 'no answer'
    return nil, 'htam-lsp did not answer htam.status: ' .. tostring(why)
  end
  return reply.result
end

---@param value any
---@return string?
local function text(value)
  return (type(value) == 'string' and value ~= '') and value or nil
end

---@param s table the htam.status answer
local function report_status(s)
  local provider = s.provider or {}
  if provider.name == 'offline' then
    h.warn(('LLM: none, mechanical strategies only (%s)'):format(provider.why or ''))
  else
    h.ok(('LLM: %s (%s)'):format(provider.name or '?', provider.why or ''))
  end
  local gpu, device = s.gpu or {}, s.device or {}
  local found = gpu.present and ('GPU: ' .. (text(gpu.name) or 'present')) or 'no NVIDIA GPU'
  h.info(('%s; candidates run on %s (%s)'):format(found, device.name or '?', device.why or ''))
  for _, compiler in ipairs({ 'nvcc', 'g++' }) do
    local path = text((s.compilers or {})[compiler])
    if path then
      h.ok(('%s: %s'):format(compiler, path))
    else
      h.warn(('%s not found on the server\'s PATH'):format(compiler))
    end
  end
  local sandbox = s.sandbox or {}
  local level = sandbox.mode == 'bwrap' and 'ok' or 'warn'
  h[level](('sandbox: %s (%s)'):format(sandbox.mode or '?', sandbox.why or ''))
  local limits = s.machine or {}
  if limits.measured then
    local level = limits.stable and 'ok' or 'warn'
    h[level](('machine: %s (measured %s, kept for every HTAM home in %s)'):format(
      limits.summary or '?', limits.measuredAt or '?', limits.path or '?'))
  elseif limits.summary then
    h.info(('machine: %s'):format(limits.summary))
  end
  local execution = s.execution or {}
  if execution.allowed then
    h.ok('execution: allowed (candidates are compiled and run)')
  else
    h.warn('execution: off, nothing generated runs', 'to allow it: ' .. (execution.howToAllow or '?'))
  end
  for _, problem in ipairs(s.problems or {}) do
    h.error('setting ignored by the server: ' .. problem)
  end
end

local function check_status()
  h.start('What htam-lsp can do here (htam.status)')
  local s, why = server_status()
  if s then
    report_status(s)
  else
    h.info(why)
  end
end

function M.check()
  local cfg = vim.lsp.config.htam or {}
  check_neovim()
  check_server(cfg)
  check_status()
end

return M
