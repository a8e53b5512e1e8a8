--- Background jobs of the server, as told by `htam/jobState` and `$/progress`.
local config = require('htam.config')

local M = {}

local TERMINAL = { done = true, failed = true, cancelled = true, refused = true }

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

---@type table<string, htam.Job>
M.jobs = {}

--- Id of the job this Neovim started last.
---@type string|integer|nil
M.last = nil

---@param msg string
---@param level? integer
local function notify(msg, level)
  if config.options.progress or (level or 0) >= vim.log.levels.WARN then
    vim.notify('HTAM: ' .. msg, level or vim.log.levels.INFO, { title = 'htam' })
  end
end

---@param job htam.Job
local function where(job)
  return job.kernel or (job.uri and vim.fs.basename(vim.uri_to_fname(job.uri))) or 'kernel'
end

---@param job htam.Job
local function report(job)
  local state = job.state
  if state == 'done' then
    local best = job.bestSpeedup
    local summary = 'no verified candidate yet'
    if type(best) == 'number' and best > 1 then
      summary = ('best %.2fx measured; :HtamApply applies it'):format(best)
    elseif type(best) == 'number' then
      summary = ('nothing faster yet (best %.2fx)'):format(best)
    end
    notify(('%s done: %s; :HtamExplain says why'):format(where(job), summary))
  elseif state == 'failed' then
    local why = job.message or 'no reason given'
    notify(('%s failed: %s'):format(where(job), why), vim.log.levels.ERROR)
  elseif state == 'refused' then
    notify(('the server refused: %s'):format(job.message or 'no reason given'), vim.log.levels.WARN)
  elseif state == 'cancelled' then
    notify(('%s cancelled'):format(where(job)))
  else
    notify(('%s %s'):format(where(job), state))
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
  if not previous or previous.state ~= job.state then
    report(job)
  end
  vim.api.nvim_exec_autocmds('User', { pattern = 'HtamJobState', modeline = false, data = job })
end

--- Show the server's work-done progress (the `LspProgress` autocmd calls this).
---@param params { token: any, value: table }
function M.on_progress(params)
  local value = params and params.value
  if type(value) ~= 'table' or value.kind == 'end' then
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
