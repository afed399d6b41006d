"""Benchmarks: `lingcode bench` (decode speed) and the per-feature benches (lsp, agent, soak)."""
