"""lingcode's editor integration: a language server over stdio (its own issue)."""
