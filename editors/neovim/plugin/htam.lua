-- HTAM user commands; everything else loads on first use.
if vim.g.loaded_htam then
  return
end
vim.g.loaded_htam = true

local function htam()
  return require('htam')
end

local command = vim.api.nvim_create_user_command

command('HtamNext', function()
  htam().next_step()
end, { desc = 'HTAM: run one optimization step for the kernel under the cursor' })

command('HtamCheck', function()
  htam().check()
end, { desc = 'HTAM: compile-check the CUDA kernel with nvcc (where no GPU runs it)' })

command('HtamOptimize', function(a)
  htam().optimize(a.args)
end, { nargs = '?', desc = 'HTAM: run N optimization steps' })

command('HtamApply', function(a)
  htam().apply({ pick = a.bang })
end, { bang = true, desc = 'HTAM: apply the best verified suggestion (! to pick one)' })

command('HtamDiff', function()
  htam().diff()
end, { desc = 'HTAM: show the best verified suggestion as a diff, without applying it' })

command('HtamExplain', function()
  htam().explain()
end, { desc = 'HTAM: show the memory rationale in a floating window' })

command('HtamResults', function()
  htam().results()
end, { desc = 'HTAM: the kernel\'s trajectory, and its suggestions in the quickfix list' })

command('HtamCancel', function()
  htam().cancel()
end, { desc = 'HTAM: cancel the running job' })

command('HtamMemory', function(a)
  htam().memory(a.args)
end, {
  nargs = '?',
  complete = function()
    return { 'cuda', 'cpu', 'triton' }
  end,
  desc = 'HTAM: show the learned memory',
})

vim.api.nvim_create_autocmd('LspProgress', {
  group = vim.api.nvim_create_augroup('htam', { clear = true }),
  desc = 'HTAM: report job progress',
  callback = function(ev)
    local client = vim.lsp.get_client_by_id(ev.data.client_id)
    if client and client.name == 'htam' then
      require('htam.jobs').on_progress(ev.data.params)
    end
  end,
})
