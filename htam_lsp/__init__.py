"""htam-lsp: the HTAM language server (pygls, stdio). It never imports torch."""
