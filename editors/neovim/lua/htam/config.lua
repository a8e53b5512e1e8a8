--- User options for the HTAM plugin and their translation into the server's settings.
local M = {}

---@class htam.Options
---@field cmd? string[] command that starts the language server (passed to vim.lsp.config)
---@field provider? 'auto'|'anthropic'|'openai'|'replay'|'offline'
---@field model? string
---@field base_url? string OpenAI-compatible endpoint
---@field steps? integer steps of `:HtamOptimize` without a count
---@field device? 'auto'|'cuda'|'cpu'
---@field allow_execution? boolean compile and run generated code (off by default)
---@field cassette? string JSONL cassette for the replay provider
---@field min_speedup? number offer a candidate only this much faster than your code (1.1)
---@field start_ahead? boolean start the next step's process while a kernel is open (default true): idle, it holds about 1.2 GB of memory; false frees it
---@field progress? boolean nil (default): echo what a running job does; true: vim.notify each phase; false: one message at the end

---@type htam.Options
local defaults = {
  provider = 'auto',
  device = 'auto',
  allow_execution = false,
}

---@type htam.Options
M.options = vim.deepcopy(defaults)

--- Only the plugin's own options are checked here; the server validates the values it
--- reads (provider, device, steps, ...) and reports what it ignored (:checkhealth htam).
---@param opts htam.Options
local function validate(opts)
  for name, expected in pairs({ cmd = 'table', progress = 'boolean' }) do
    local ok, err = pcall(vim.validate, name, opts[name], expected, true)
    if not ok then
      error('htam.setup: ' .. tostring(err), 0)
    end
  end
  if opts.cmd ~= nil and type(opts.cmd[1]) ~= 'string' then
    error('htam.setup: cmd must be a list of strings, e.g. { "htam-lsp" }', 0)
  end
end

--- Merge `opts` into the current options (later calls refine earlier ones).
---@param opts? htam.Options
function M.apply(opts)
  opts = opts or {}
  validate(opts)
  M.options = vim.tbl_deep_extend('force', M.options, opts)
end

--- The settings the server reads from `initializationOptions` and the `htam` section.
---@return table<string, any>
function M.server_settings()
  local o = M.options
  return {
    provider = o.provider,
    model = o.model,
    baseUrl = o.base_url,
    steps = o.steps,
    device = o.device,
    allowExecution = o.allow_execution,
    minSpeedup = o.min_speedup,
    startAhead = o.start_ahead,
    cassette = type(o.cassette) == 'string'
        and vim.fs.normalize(vim.fn.fnamemodify(o.cassette, ':p'))
      or o.cassette,
  }
end

--- Write the server settings into a client's `settings` table (section `htam`): the
--- options given to `setup()` win over values set with `vim.lsp.config`.
---@param settings table
---@return table<string, any> the merged `htam` section
function M.sync(settings)
  settings.htam = vim.tbl_extend('force', settings.htam or {}, M.server_settings())
  return settings.htam
end

--- The pip command that installs the language server into `python`: from the HTAM checkout
--- this plugin lives in (its package, `htam-lsp`, is not on PyPI yet, and `htam` there is
--- an unrelated project); `<path-to-htam>` where the plugin was copied out of one.
---@param python string
---@return string
function M.install_command(python)
  local here = debug.getinfo(1, 'S').source:sub(2) -- <checkout>/editors/neovim/lua/htam/config.lua
  local checkout = vim.fn.fnamemodify(here, ':p:h:h:h:h:h')
  local found = vim.uv.fs_stat(vim.fs.joinpath(checkout, 'pyproject.toml')) ~= nil
  return ('%s -m pip install -e %s'):format(python, found and checkout or '<path-to-htam>')
end

return M
