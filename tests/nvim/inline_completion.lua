-- Neovim's built-in LSP client attached to `lingcode lsp`, asking for an inline completion.
-- Run: nvim --headless --clean -l inline_completion.lua PYTHON FILE LINE COL OUT
-- LINE is 1-based, COL 0-based (Neovim's cursor). Writes what happened to OUT as JSON.
local python, file, line, col, out = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5]

local function finish(result)
  vim.fn.writefile({ vim.json.encode(result) }, out)
  vim.cmd('qa!')
end

vim.cmd.edit(vim.fn.fnameescape(file))
vim.bo.filetype = 'python'
local client_id = vim.lsp.start({
  name = 'lingcode',
  cmd = { python, '-m', 'lingcode', 'lsp', '--no-start' },
  root_dir = vim.fs.dirname(file),
  init_options = { maxTokens = 16 },
})
local attached = vim.wait(60000, function()
  local client = vim.lsp.get_client_by_id(client_id)
  return client ~= nil and client.initialized
end, 20)
if not attached then
  return finish({ error = 'the language server did not initialize' })
end

local client = vim.lsp.get_client_by_id(client_id)
vim.api.nvim_win_set_cursor(0, { line, col })
local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
params.context = { triggerKind = 1 } -- Invoked
local response, err = client:request_sync('textDocument/inlineCompletion', params, 240000, 0)
finish({
  version = tostring(vim.version()),
  server = client.server_info,
  supports = client:supports_method('textDocument/inlineCompletion'),
  response = response,
  error = err,
})
