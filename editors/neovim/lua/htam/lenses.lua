--- Code lenses of the server, refreshed where Neovim 0.11 does not refresh them itself.
local M = {}

local DELAY_MS = 300 -- after the last change: the server answers for the settled text

---@type table<integer, integer>
local asked = {} -- bufnr -> the number of the newest lens request
---@type table<integer, integer>
local shown = {} -- bufnr -> the number of the request whose answer is shown

--- Ask the server for the lenses of `bufnr` now and show its answer, unless the answer to
--- a later request is shown already. Not `vim.lsp.codelens.refresh()`: it drops a refresh
--- asked while one is in flight, so the lens asked for when a job ended could stay
--- "running" (the answer in flight) until the next edit.
---@param bufnr integer
function M.refresh(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local n = (asked[bufnr] or 0) + 1
  asked[bufnr] = n
  local params = { textDocument = vim.lsp.util.make_text_document_params(bufnr) }
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = bufnr, name = 'htam' })) do
    client:request('textDocument/codeLens', params, function(err, result, ctx)
      if (shown[bufnr] or 0) < n and vim.api.nvim_buf_is_valid(bufnr) then
        shown[bufnr] = n
        vim.lsp.codelens.on_codelens(err, result, ctx)
      end
    end, bufnr)
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
