--- Background jobs of the server, as told by `htam/jobState` and `$/progress`.
local config = require('htam.config')

local M = {}

local TERMINAL = {} ---@type table<string, boolean>
for _, state in ipairs(require('htam.vocabulary').terminal_job_states) do
  TERMINAL[state] = true
end

---@class htam.Job
---@field jobId string|integer
---@field uri? string
---@field kernel? string
---@field state string queued|running|done|failed|cancelled|refused
---@field step? integer
---@field steps? integer
---@field phase? string
---@field message? string
---@field bestSpeedup? number
---@field refSpeedup? number
---@field suggestions? integer apply actions offered when the job ended

---@type table<string, htam.Job>
M.jobs = {}

--- Id of the job this Neovim started last.
---@type string|integer|nil
M.last = nil

---@param msg string
---@param level? integer
local function notify(msg, level)
  vim.notify('HTAM: ' .. msg, level or vim.log.levels.INFO, { title = 'htam' })
end

---@param job htam.Job
local function where(job)
  return job.kernel or (job.uri and vim.fs.basename(vim.uri_to_fname(job.uri))) or 'kernel'
end

local LEVELS = {
  done = vim.log.levels.INFO,
  cancelled = vim.log.levels.INFO,
  refused = vim.log.levels.WARN,
  failed = vim.log.levels.ERROR,
}

--- One message when a job ends, in the server's words (it knows why).
---@param job htam.Job
local function report(job)
  local level = LEVELS[job.state]
  if not level then
    return
  end
  local why = job.message ~= nil and job.message ~= '' and job.message or job.state
  why = why:gsub('^HTAM:%s*', '') -- the server's refusals may name themselves already
  local next_step = ''
  if job.state == 'done' and (job.suggestions or 0) > 0 then
    next_step = ' :HtamApply applies it (:HtamDiff shows it first).'
  end
  local stop = why:match('[.!?]$') and '' or '.' -- one period, never two
  notify(('%s %s: %s%s%s'):format(where(job), job.state, why, stop, next_step), level)
end

--- What a running job is doing, on one line: `ModelNew: step 1/6: compile ...`.
---@param job htam.Job
---@return string
function M.progress_line(job)
  local doing = job.message ~= nil and job.message ~= '' and job.message or job.state
  return ('HTAM: %s: %s (:HtamCancel stops it)'):format(where(job), doing)
end

--- While a job runs, say what it does where a stock Neovim shows it: the command line
--- (a transient echo, kept out of :messages) and the kernel's code lens. With `progress =
--- true` each phase is a vim.notify() message instead (LspProgress); `false`: silence
--- until the job ends.
---@param job htam.Job
local function show_running(job)
  if job.uri then
    require('htam.lenses').soon(vim.uri_to_bufnr(job.uri))
  end
  if config.options.progress == nil then
    M.echoed = M.progress_line(job)
    vim.api.nvim_echo({ { M.echoed } }, false, {})
  end
end

--- Remember a job started by a command (its state arrives by notification).
---@param job_id string|integer
---@param uri string
function M.started(job_id, uri)
  local key = tostring(job_id)
  M.jobs[key] = M.jobs[key] or { jobId = job_id, uri = uri, state = 'queued' }
  M.last = job_id
end

--- Handler of the server's `htam/jobState` notification.
---@param result? htam.Job
function M.on_job_state(_, result, _)
  if type(result) ~= 'table' or result.jobId == nil then
    return
  end
  local key = tostring(result.jobId)
  local previous = M.jobs[key]
  local job = vim.deepcopy(previous or {})
  for name, value in pairs(result) do
    if value == vim.NIL then -- JSON null: the field is not known (yet)
      job[name] = nil
    else
      job[name] = value
    end
  end
  M.jobs[key] = job
  local changed = not previous or previous.state ~= job.state
  if changed then
    report(job)
    if TERMINAL[job.state] and job.uri then -- the lenses now show the result
      require('htam.lenses').refresh(vim.uri_to_bufnr(job.uri))
    end
  end
  if not TERMINAL[job.state] and (changed or previous.message ~= job.message) then
    show_running(job)
  end
  vim.api.nvim_exec_autocmds('User', { pattern = 'HtamJobState', modeline = false, data = job })
end

--- Phase-by-phase progress (the `LspProgress` autocmd calls this): notified only with
--- `progress = true`; otherwise the echo above says it (and a progress plugin may too).
---@param params { token: any, value: table }
function M.on_progress(params)
  local value = params and params.value
  if config.options.progress ~= true or type(value) ~= 'table' or value.kind == 'end' then
    return
  end
  -- Titles such as "HTAM: softmax" repeat the prefix that notify() adds.
  local title = (value.title or ''):gsub('^HTAM:?%s*', '')
  local text = table.concat(
    vim.tbl_filter(function(part)
      return part ~= ''
    end, { title, value.message or '' }),
    ': '
  )
  if value.percentage then
    text = ('%s (%d%%)'):format(text, value.percentage)
  end
  if text ~= '' then
    notify(text)
  end
end

---@param job_id string|integer|nil
---@return boolean
function M.finished(job_id)
  local job = job_id ~= nil and M.jobs[tostring(job_id)] or nil
  return job ~= nil and TERMINAL[job.state] == true
end

--- The most recent job that has not finished, if any.
---@return htam.Job?
function M.active()
  if M.last ~= nil and not M.finished(M.last) then
    return M.jobs[tostring(M.last)]
  end
  for _, job in pairs(M.jobs) do
    if not TERMINAL[job.state] then
      return job
    end
  end
end

--- One short line for a statusline: `HTAM 2/6 compile` while a job runs.
---@return string
function M.status()
  local job = M.active()
  if not job then
    return ''
  end
  local parts = { 'HTAM' }
  if job.step and job.steps then
    parts[#parts + 1] = ('%d/%d'):format(job.step, job.steps)
  end
  parts[#parts + 1] = job.phase or job.state
  return table.concat(parts, ' ')
end

return M
