--- HTAM for Neovim: user-facing actions behind the `:Htam*` commands.
local config = require('htam.config')
local jobs = require('htam.jobs')
local ui = require('htam.ui')

local M = {}

local NAME = 'htam'
local KIND = 'refactor.rewrite.htam'
local WARN = vim.log.levels.WARN
local ERROR = vim.log.levels.ERROR

---@param msg string
---@param level? integer
local function say(msg, level)
  vim.notify('HTAM: ' .. msg, level or vim.log.levels.INFO, { title = NAME })
end

---@param clients vim.lsp.Client[]
---@param fn fun()
---@param tries integer
local function when_stopped(clients, fn, tries)
  local stopped = vim.iter(clients):all(function(client)
    return client:is_stopped()
  end)
  if stopped or tries == 0 then
    fn()
  else
    vim.defer_fn(function()
      when_stopped(clients, fn, tries - 1)
    end, 50)
  end
end

--- Stop the clients, then let `vim.lsp.enable` start fresh ones for the open buffers.
---@param clients vim.lsp.Client[]
local function restart(clients)
  say('restarting htam-lsp so that execution is allowed')
  for _, client in ipairs(clients) do
    client:stop()
  end
  when_stopped(clients, function()
    vim.cmd.doautoall('nvim.lsp.enable FileType')
  end, 100)
end

--- Configure the plugin (may be called before or after `vim.lsp.enable('htam')`).
--- Invalid options are reported and change nothing.
---@param opts? htam.Options
---@return boolean ok
function M.setup(opts)
  local ok, err = pcall(config.apply, opts)
  if not ok then
    say(tostring(err), ERROR)
    return false
  end
  if opts and opts.cmd then
    vim.lsp.config(NAME, { cmd = opts.cmd })
  end
  local clients = vim.lsp.get_clients({ name = NAME })
  local grant = false
  for _, client in ipairs(clients) do
    local granted = (client.config.init_options or {}).allowExecution == true
    grant = grant or (config.options.allow_execution and not granted)
    config.sync(client.settings)
    client:notify('workspace/didChangeConfiguration', { settings = client.settings })
  end
  -- The server lets only initialization options grant execution (a workspace's settings
  -- could come from an untrusted repository), so granting it needs a fresh server.
  if grant and vim.lsp.is_enabled(NAME) then
    restart(clients)
  elseif grant then
    say('restart htam-lsp to allow execution (it was not started by vim.lsp.enable)', WARN)
  end
  return true
end

--- How the server's process ended, with the reason when one could be found.
---@param exit { code: integer, signal: integer, why?: string }
---@return string
local function exit_text(exit)
  local signal = exit.signal ~= 0 and (' (signal %d)'):format(exit.signal) or ''
  local why = exit.why and (': ' .. exit.why) or ''
  return ('htam-lsp exited with code %d%s%s; :checkhealth htam and :LspLog say more'):format(
    exit.code,
    signal,
    why
  )
end

--- Why no HTAM client is attached, in plain words.
---@return string
local function why_no_client()
  if not vim.lsp.is_enabled(NAME) then
    return "the language server is not enabled: add vim.lsp.enable('htam') to your config"
  end
  local cmd = (vim.lsp.config[NAME] or {}).cmd
  if type(cmd) == 'table' and type(cmd[1]) == 'string' and vim.fn.executable(cmd[1]) == 0 then
    return ('the language server cannot start: `%s` is not an executable on $PATH '
      .. '(install it: %s, or setup({ cmd = { "/path/to/htam-lsp" } })); :checkhealth htam'):format(
      cmd[1],
      config.install_command('python3')
    )
  end
  local exit = M.server_exit
  if exit and exit.code ~= 0 then
    return exit_text(exit)
  end
  local ft = vim.bo.filetype
  if ft ~= 'cuda' and ft ~= 'python' then
    return ('htam-lsp works on CUDA (.cu) and Python kernel files, not on %s'):format(
      ft ~= '' and ft or 'this buffer'
    )
  end
  return 'htam-lsp is not attached to this buffer yet: try again in a moment'
end

--- The HTAM client of the current buffer; says why when there is none.
---@param any_buffer? boolean accept a client attached to another buffer
---@return vim.lsp.Client?
local function get_client(any_buffer)
  local filter = { name = NAME, bufnr = (not any_buffer) and 0 or nil }
  local client = vim.lsp.get_clients(filter)[1]
  if client then
    return client
  end
  say(why_no_client(), WARN)
end

--- Remember how the server process ended (the `on_exit` of lsp/htam.lua).
---@param code integer
---@param signal integer
function M.on_exit(code, signal)
  local exit = { code = code, signal = signal }
  M.server_exit = exit
  if code == 0 then
    return
  end
  -- A server that cannot start (a Python without htam, a wrong cmd) says so once, plainly.
  vim.schedule(function()
    local cfg = vim.lsp.config[NAME] or {}
    exit.why = require('htam.health').server_problem(cfg.cmd, cfg.cmd_env)
    say(exit_text(exit), WARN)
  end)
end

---@param client vim.lsp.Client
---@param command string
---@param arguments table
---@param on_result fun(result: any)
local function execute(client, command, arguments, on_result)
  local params = { command = command, arguments = arguments }
  client:request('workspace/executeCommand', params, function(err, result)
    if err then
      say(('%s failed: %s'):format(command, err.message), ERROR)
    else
      on_result(result)
    end
  end, vim.api.nvim_get_current_buf())
end

---@param client vim.lsp.Client
---@return { uri: string, position: lsp.Position }
local function here(client)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  return { uri = params.textDocument.uri, position = params.position }
end

---@return boolean
local function execution_allowed()
  if config.options.allow_execution then
    return true
  end
  say(
    'execution is off: HTAM compiles and runs generated code only after you opt in with '
      .. "require('htam').setup({ allow_execution = true })",
    WARN
  )
  return false
end

---@param command string
---@param extra? table
local function start_job(command, extra)
  local client = get_client()
  if not client or not execution_allowed() then
    return
  end
  local args = vim.tbl_extend('force', here(client), extra or {})
  execute(client, command, { args }, function(result)
    if type(result) ~= 'table' or result.jobId == nil then
      say(command .. ' started no job: ' .. vim.inspect(result), WARN)
      return
    end
    jobs.started(result.jobId, args.uri)
    if result.alreadyRunning then
      say(('job %s is already running for this file; :HtamCancel stops it'):format(result.jobId))
    end -- otherwise quiet: one message when the job ends (htam/jobState)
  end)
end

--- Run one optimization step for the kernel under the cursor (`:HtamNext`).
function M.next_step()
  start_job('htam.nextStep')
end

--- Compile the CUDA kernel under the cursor with nvcc (`:HtamCheck`), where no GPU can
--- run it; a compile error becomes a diagnostic.
function M.check()
  start_job('htam.compileCheck')
end

--- Run N steps (`:HtamOptimize [N]`); without N the server's or setup's `steps`.
---@param steps? integer|string
function M.optimize(steps)
  local n ---@type number?
  if steps ~= nil and steps ~= '' then
    n = tonumber(steps)
    local bounds = require('htam.vocabulary')
    if not n or n < bounds.min_steps or n > bounds.max_steps or n % 1 ~= 0 then
      local expected = ('a whole number of steps from %d to %d'):format(bounds.min_steps, bounds.max_steps)
      say(('HtamOptimize expects %s, got %q'):format(expected, steps), ERROR)
      return
    end
  end
  start_job('htam.optimize', { steps = n or config.options.steps })
end

--- A verified candidate (`refactor.rewrite.htam.<local_id>`), not the plain
--- `refactor.rewrite.htam` "run the next step" action.
---@param action lsp.CodeAction|lsp.Command
---@return boolean
local function is_suggestion(action)
  return type(action.kind) == 'string'
    and vim.startswith(action.kind, KIND .. '.')
    and action.disabled == nil
end

--- The measured speedup the server put in the action's data (never read from titles).
---@param action lsp.CodeAction
---@return number
local function measured(action)
  local data = type(action.data) == 'table' and action.data or {}
  return type(data.speedup) == 'number' and data.speedup or 0
end

--- The preferred action, else the one with the highest measured speedup.
---@param actions lsp.CodeAction[]
---@return lsp.CodeAction
local function best_of(actions)
  local best = actions[1]
  for _, action in ipairs(actions) do
    if action.isPreferred and not best.isPreferred then
      best = action
    elseif
      (action.isPreferred or false) == (best.isPreferred or false)
      and measured(action) > measured(best)
    then
      best = action
    end
  end
  return best
end

---@param client vim.lsp.Client
---@param on_actions fun(actions: lsp.CodeAction[], bufnr: integer)
local function suggestions(client, on_actions)
  local bufnr = vim.api.nvim_get_current_buf()
  local params = vim.lsp.util.make_range_params(0, client.offset_encoding) --[[@as table]]
  params.context = { only = { KIND }, diagnostics = {}, triggerKind = 1 }
  client:request('textDocument/codeAction', params, function(err, result)
    if err then
      say('code actions failed: ' .. err.message, ERROR)
      return
    end
    local actions = vim.tbl_filter(is_suggestion, result or {})
    if #actions == 0 then
      say('nothing to apply here: no candidate is verified and faster yet (:HtamNext)', WARN)
    elseif vim.api.nvim_get_current_buf() ~= bufnr then
      say('the buffer changed before the suggestions arrived; try again', WARN)
    else
      on_actions(actions, bufnr)
    end
  end, bufnr)
end

--- Apply the best verified suggestion at the cursor (`:HtamApply`), or pick one
--- from a menu (`:HtamApply!`).
---@param opts? { pick?: boolean }
function M.apply(opts)
  local client = get_client()
  if not client then
    return
  end
  suggestions(client, function(actions)
    local chosen = not (opts and opts.pick) and best_of(actions) or nil
    vim.lsp.buf.code_action({
      context = { only = { KIND }, diagnostics = {} },
      filter = function(action)
        return is_suggestion(action) and (chosen == nil or action.title == chosen.title)
      end,
      apply = chosen ~= nil,
    })
  end)
end

--- The text edits of a resolved action for `uri` (`changes` or `documentChanges`).
---@param edit lsp.WorkspaceEdit
---@param uri string
---@return lsp.TextEdit[]
local function edits_for(edit, uri)
  if edit.changes and edit.changes[uri] then
    return edit.changes[uri]
  end
  local found = {}
  for _, change in ipairs(edit.documentChanges or {}) do
    if change.textDocument and change.textDocument.uri == uri then
      vim.list_extend(found, change.edits)
    end
  end
  return found
end

--- Show the best suggestion as a diff against the buffer (`:HtamDiff`), without applying
--- it: a scratch buffer with the suggested text, diffed with the kernel's window.
function M.diff()
  local client = get_client()
  if not client then
    return
  end
  suggestions(client, function(actions, bufnr)
    local chosen = best_of(actions)
    client:request('codeAction/resolve', chosen, function(err, resolved)
      if err or not (resolved and resolved.edit) then
        say('the suggestion no longer applies: ' .. (err and err.message or 'no edit'), WARN)
        return
      end
      local uri = vim.uri_from_bufnr(bufnr)
      local scratch = ui.suggested(bufnr, edits_for(resolved.edit, uri), client.offset_encoding)
      say(('%s: :HtamApply applies it; :bwipeout htam://suggestion closes the diff'):format(chosen.title))
      return scratch
    end, bufnr)
  end)
end

---@param client vim.lsp.Client
local function explain_by_hover(client)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  client:request('textDocument/hover', params, function(err, result)
    if err or type(result) ~= 'table' or not result.contents then
      say('no rationale for this position yet: run :HtamNext on a kernel first', WARN)
      return
    end
    local lines = vim.lsp.util.convert_input_to_markdown_lines(result.contents)
    ui.float(table.concat(lines, '\n'))
  end, vim.api.nvim_get_current_buf())
end

--- Show the memory rationale for the kernel under the cursor (`:HtamExplain`):
--- `htam.explain`, or the server's hover where the command gives nothing.
function M.explain()
  local client = get_client()
  if not client then
    return
  end
  execute(client, 'htam.explain', { here(client) }, function(result)
    if type(result) == 'table' and type(result.markdown) == 'string' and result.markdown ~= '' then
      ui.float(result.markdown)
    else
      explain_by_hover(client)
    end
  end)
end

--- The kernel's results (`:HtamResults`): its trajectory in a scratch buffer, and the
--- suggestions offered now in the quickfix list (one entry on each one's first line).
function M.results()
  local client = get_client()
  if not client then
    return
  end
  local bufnr = vim.api.nvim_get_current_buf()
  execute(client, 'htam.results', { here(client) }, function(result)
    if type(result) ~= 'table' or type(result.markdown) ~= 'string' then
      say('htam.results returned nothing', WARN)
      return
    end
    local items = vim.tbl_map(function(s)
      return { bufnr = bufnr, lnum = s.line + 1, col = 1, text = s.title }
    end, result.suggestions or {})
    vim.fn.setqflist({}, ' ', { title = 'HTAM: ' .. tostring(result.kernel), items = items })
    ui.scratch('htam://results', result.markdown)
    if #items > 0 then
      say(('%d suggestion(s) in the quickfix list (:copen)'):format(#items))
    end
  end)
end

--- Cancel the running job (`:HtamCancel`).
function M.cancel()
  local client = get_client(true)
  if not client then
    return
  end
  local job = jobs.active()
  local args = job and { jobId = job.jobId } or vim.empty_dict()
  execute(client, 'htam.cancel', { args }, function(result)
    local stopped = type(result) == 'table' and type(result.cancelled) == 'table' and result.cancelled
      or {}
    if #stopped == 0 then
      say('nothing is running')
    else
      say(('stopping %s (its finished steps are kept)'):format(job and job.kernel or stopped[1]))
    end
  end)
end

--- Show the learned memory (`:HtamMemory [cuda|cpu]`) in a scratch buffer.
---@param backend? string
function M.memory(backend)
  local client = get_client(true)
  if not client then
    return
  end
  -- Without a backend the server shows the one of the current buffer's kernel, else (any
  -- other buffer) of the kernel worked in last, saying which.
  local args = vim.empty_dict()
  if backend and backend ~= '' then
    args = { backend = backend }
  elseif vim.lsp.buf_is_attached(0, client.id) then
    args = { uri = vim.uri_from_bufnr(0) }
  end
  execute(client, 'htam.showMemory', { args }, function(result)
    if type(result) == 'table' and type(result.markdown) == 'string' then
      ui.scratch('htam://memory', result.markdown)
    else
      say('htam.showMemory returned no Markdown', WARN)
    end
  end)
end

--- One short line for a statusline while a job runs (`HTAM 2/6 compile`), else ''.
---@return string
function M.status()
  return jobs.status()
end

return M
