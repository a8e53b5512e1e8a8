--- HTAM language server: `vim.lsp.enable('htam')` is the whole set-up.
--- Options come from `require('htam').setup({...})`; see `:help htam`.
---@type vim.lsp.Config
return {
  cmd = { 'htam-lsp' },
  filetypes = { 'cuda', 'python' },
  root_markers = { 'htam.toml', '.git', 'pyproject.toml' },
  settings = { htam = {} },
  -- Read the options when the server starts, so setup() may run before or after enable().
  before_init = function(params, config)
    local htam = require('htam.config').sync(config.settings)
    config.init_options = vim.tbl_extend('force', config.init_options or {}, htam)
    params.initializationOptions = config.init_options
  end,
  -- Neovim 0.11 shows code lenses only when asked: the "Optimize with HTAM" and "Best:"
  -- lenses are refreshed on attach, on entering the buffer and after leaving insert mode.
  on_attach = function(client, bufnr)
    require('htam.lenses').attach(client, bufnr)
  end,
  on_exit = function(code, signal)
    require('htam').on_exit(code, signal)
  end,
  handlers = {
    ['htam/jobState'] = function(err, result, ctx)
      return require('htam.jobs').on_job_state(err, result, ctx)
    end,
  },
}
