"""The embedded "local" engine: pure torch, batch 1, GGUF or Hugging Face Llama-family models."""

from lingcode.engine.local.engine import LocalEngine, load_engine

__all__ = ["LocalEngine", "load_engine"]
