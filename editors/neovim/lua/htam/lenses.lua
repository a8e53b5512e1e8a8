--- Code lenses of the server, refreshed where Neovim 0.11 does not refresh them itself.
local M = {}

local DELAY_MS = 300 -- after the last change: the server answers for the settled text

---@param bufnr integer
function M.refresh(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.lsp.codelens.refresh({ bufnr = bufnr })
  end
end

---@type table<integer, uv.uv_timer_t>
local timers = {}

--- Refresh once the buffer has not changed for DELAY_MS.
---@param bufnr integer
local function later(bufnr)
  local timer = timers[bufnr] or assert(vim.uv.new_timer())
  timers[bufnr] = timer
  timer:stop()
  timer:start(DELAY_MS, 0, vim.schedule_wrap(function()
    M.refresh(bufnr)
  end))
end

---@type table<integer, boolean>
local pending = {}

--- Refresh within DELAY_MS, at most once per DELAY_MS however often a job moves on (the
--- running lens says its phase).
---@param bufnr integer
function M.soon(bufnr)
  if pending[bufnr] then
    return
  end
  pending[bufnr] = true
  vim.defer_fn(function()
    pending[bufnr] = nil
    M.refresh(bufnr)
  end, DELAY_MS)
end

--- Refresh the lenses of `bufnr` now, on BufEnter and after every change to its text
--- (typed, applied from a code action, undone).
---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if not client:supports_method('textDocument/codeLens', bufnr) then
    return
  end
  local group = vim.api.nvim_create_augroup(('htam-lenses-%d'):format(bufnr), { clear = true })
  vim.api.nvim_create_autocmd('BufEnter', {
    group = group,
    buffer = bufnr,
    callback = function()
      M.refresh(bufnr)
    end,
  })
  vim.api.nvim_buf_attach(bufnr, false, {
    on_lines = function()
      later(bufnr)
    end,
    on_detach = function()
      local timer = timers[bufnr]
      timers[bufnr] = nil
      if timer then
        timer:close()
      end
    end,
  })
  M.refresh(bufnr)
end

return M
