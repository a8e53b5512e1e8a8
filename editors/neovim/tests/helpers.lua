-- Shared pieces of the headless tests: plugin on the runtimepath, captured
-- notifications, waiting, and a runner that exits non-zero on the first failure.
local H = {}

local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
H.root = vim.fs.dirname(here)
H.tests = here

---@type { msg: string, level: integer }[]
H.messages = {}

function H.load_plugin()
  vim.o.columns, vim.o.lines = 110, 32 -- the size of the screen captures
  vim.opt.rtp:prepend(H.root)
  vim.cmd('filetype on')
  vim.cmd.runtime('plugin/htam.lua')
  vim.notify = function(msg, level)
    table.insert(H.messages, { msg = msg, level = level or vim.log.levels.INFO })
    io.stdout:write(('  notify[%s] %s\n'):format(level or 2, msg))
  end
end

---@param ms integer
---@param cond fun(): boolean
---@param what string
function H.wait(ms, cond, what)
  if not vim.wait(ms, cond, 50) then
    error('timed out after ' .. ms .. ' ms waiting for ' .. what, 2)
  end
end

--- Wait until a notification matching `pattern` (plain text) arrives after index `from`.
---@return { msg: string, level: integer }
function H.wait_message(pattern, from, ms)
  local found
  H.wait(ms or 5000, function()
    for i = (from or 0) + 1, #H.messages do
      if H.messages[i].msg:find(pattern, 1, true) then
        found = H.messages[i]
        return true
      end
    end
    return false
  end, 'a message containing "' .. pattern .. '"')
  return found
end

function H.eq(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    error(('%s: expected %s, got %s'):format(what, vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

function H.truthy(value, what)
  if not value then
    error(what, 2)
  end
  return value
end

---@return string
function H.buffer_text(bufnr)
  return table.concat(vim.api.nvim_buf_get_lines(bufnr or 0, 0, -1, false), '\n')
end

--- The HTAM client attached to the current buffer, once it has initialized.
---@return vim.lsp.Client
function H.attached(ms)
  local client
  H.wait(ms or 15000, function()
    client = vim.lsp.get_clients({ name = 'htam', bufnr = 0 })[1]
    return client ~= nil and client.initialized == true
  end, 'htam-lsp to attach')
  return client
end

--- Text of the first floating window, once one is open.
---@return string
function H.float_text(ms)
  local text
  H.wait(ms or 10000, function()
    for _, win in ipairs(vim.api.nvim_list_wins()) do
      if vim.api.nvim_win_get_config(win).relative ~= '' then
        text = H.buffer_text(vim.api.nvim_win_get_buf(win))
        return true
      end
    end
    return false
  end, 'a floating window')
  return text
end

--- Lines of `:checkhealth htam`.
---@return string
function H.checkhealth()
  vim.cmd('checkhealth htam')
  local text = H.buffer_text(0)
  vim.cmd('tabclose')
  return text
end

--- The text on the screen (floating windows included), as a user would see it.
---@return string
function H.screen()
  vim.cmd('redraw!')
  local rows = {}
  for row = 1, vim.o.lines do
    local chars = {}
    for col = 1, vim.o.columns do
      chars[#chars + 1] = vim.fn.screenstring(row, col)
    end
    rows[#rows + 1] = (table.concat(chars):gsub('%s+$', ''))
  end
  return table.concat(rows, '\n')
end

--- Save a screen capture (and the messages since `from`) as `$HTAM_CAPTURES/<name>.txt`.
---@param name string
---@param from? integer index into H.messages
function H.capture(name, from)
  local folder = vim.env.HTAM_CAPTURES
  if not folder or folder == '' then
    return
  end
  vim.fn.mkdir(folder, 'p')
  local said = {}
  for i = (from or 0) + 1, #H.messages do
    said[#said + 1] = H.messages[i].msg
  end
  -- Without a UI attached, floating windows are not composed onto the screen: add them.
  local floats = {}
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= '' then
      floats[#floats + 1] = '-- floating window --\n' .. H.buffer_text(vim.api.nvim_win_get_buf(win))
    end
  end
  local text = table.concat({
    H.screen(),
    table.concat(floats, '\n\n'),
    '-- messages --\n' .. table.concat(said, '\n'),
  }, '\n\n') .. '\n'
  -- the checkout's path is this machine's: a capture names it as the docs do
  local checkout = vim.fs.dirname(vim.fs.dirname(H.root))
  text = text:gsub(vim.pesc(checkout), '<path-to-htam>')
  vim.fn.writefile(vim.split(text, '\n', { plain = true }), folder .. '/' .. name .. '.txt')
end

--- Run the named test functions in order; stop at the first failure.
---@param cases { [1]: string, [2]: fun() }[]
function H.run(cases)
  for _, case in ipairs(cases) do
    local start = vim.uv.hrtime()
    local ok, err = xpcall(case[2], debug.traceback)
    if not ok then
      io.stdout:write(('FAIL %s\n%s\n'):format(case[1], err))
      vim.cmd('cquit 1')
      return
    end
    io.stdout:write(('ok   %s (%.1f s)\n'):format(case[1], (vim.uv.hrtime() - start) / 1e9))
  end
  io.stdout:write(('all %d passed\n'):format(#cases))
  vim.cmd('qall!')
end

return H
