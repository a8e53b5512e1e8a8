--- Windows that show the server's Markdown.
local M = {}

--- The rationale in a floating window next to the cursor.
---@param markdown string
---@return integer bufnr, integer winid
function M.float(markdown)
  local lines = vim.split(markdown, '\n', { plain = true })
  return vim.lsp.util.open_floating_preview(lines, 'markdown', {
    border = 'rounded',
    focus_id = 'htam-explain',
    max_width = math.max(40, math.floor(vim.o.columns * 0.8)),
    max_height = math.max(10, math.floor(vim.o.lines * 0.7)),
  })
end

--- A reusable scratch buffer in a split (for long pages such as the memory).
---@param name string buffer name, e.g. `htam://memory`
---@param markdown string
---@return integer bufnr
function M.scratch(name, markdown)
  local bufnr = vim.fn.bufnr(name)
  if bufnr == -1 then
    bufnr = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(bufnr, name)
    vim.bo[bufnr].filetype = 'markdown'
  end
  vim.bo[bufnr].modifiable = true
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, vim.split(markdown, '\n', { plain = true }))
  vim.bo[bufnr].modifiable = false
  local winid = vim.fn.bufwinid(bufnr)
  if winid == -1 then
    vim.cmd.split()
    vim.api.nvim_win_set_buf(0, bufnr)
  else
    vim.api.nvim_set_current_win(winid)
  end
  return bufnr
end

--- The buffer `bufnr` with `edits` applied, in a scratch buffer diffed against it in a
--- vertical split (`htam://suggestion`); the kernel's buffer is not changed. Closing the
--- suggestion's window (or `:bwipeout htam://suggestion`) ends the diff.
---@param bufnr integer
---@param edits lsp.TextEdit[]
---@param encoding string
---@return integer scratch
function M.suggested(bufnr, edits, encoding)
  local name = 'htam://suggestion'
  local old = vim.fn.bufnr(name)
  if old ~= -1 then
    vim.api.nvim_buf_delete(old, { force = true })
  end
  local scratch = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(scratch, name)
  vim.bo[scratch].filetype = vim.bo[bufnr].filetype
  vim.api.nvim_buf_set_lines(scratch, 0, -1, false, vim.api.nvim_buf_get_lines(bufnr, 0, -1, false))
  vim.lsp.util.apply_text_edits(edits, scratch, encoding)
  vim.bo[scratch].modifiable = false
  vim.bo[scratch].bufhidden = 'wipe' -- closing its window ends the diff
  local kernel_win = vim.fn.bufwinid(bufnr)
  vim.api.nvim_set_current_win(kernel_win)
  vim.cmd.diffthis()
  vim.cmd('vertical rightbelow split')
  vim.api.nvim_win_set_buf(0, scratch)
  vim.cmd.diffthis()
  vim.api.nvim_create_autocmd('BufWipeout', {
    buffer = scratch,
    once = true,
    callback = function()
      if vim.api.nvim_win_is_valid(kernel_win) then
        vim.api.nvim_win_call(kernel_win, function()
          vim.cmd.diffoff()
        end)
      end
    end,
  })
  vim.api.nvim_set_current_win(kernel_win)
  return scratch
end

return M
