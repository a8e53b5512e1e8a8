--- Code lenses of the server, refreshed where Neovim 0.11 does not refresh them itself.
local M = {}

---@param bufnr integer
function M.refresh(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.lsp.codelens.refresh({ bufnr = bufnr })
  end
end

--- Refresh the lenses of `bufnr` now, on BufEnter, InsertLeave and any change made in
--- normal mode (an applied suggestion, an undo).
---@param client vim.lsp.Client
---@param bufnr integer
function M.attach(client, bufnr)
  if not client:supports_method('textDocument/codeLens', bufnr) then
    return
  end
  local group = vim.api.nvim_create_augroup(('htam-lenses-%d'):format(bufnr), { clear = true })
  vim.api.nvim_create_autocmd({ 'BufEnter', 'InsertLeave', 'TextChanged' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.refresh(bufnr)
    end,
  })
  M.refresh(bufnr)
end

return M
