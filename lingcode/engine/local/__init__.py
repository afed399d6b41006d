"""The embedded "local" engine: pure torch, batch 1, GGUF or Hugging Face Llama-family models."""

import os

# torch's CPU bf16 matmuls go through oneDNN, which builds a kernel (a "primitive", with its
# scratch memory) per input shape and keeps it in two caches of 1024 entries each (oneDNN's and
# ideep's). Prefill chunks come in every width from 1 to 512, so over a long uptime these caches
# filled up and were never returned (docs/engine-notes.md; tests/test_engine_memory.py). A forward
# pass uses about five shapes, so 16 entries keep every hit that matters. Read at the first
# matmul, so set here, before the engine runs one; a value the user set wins.
for _name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_name, "16")

__all__ = ["LocalEngine", "load_engine"]


def __getattr__(name: str):
    # Lazily, so that the package's own modules (`from lingcode.engine.local import cpu_native`)
    # do not import the engine, which imports them: no import cycle through this file.
    if name in __all__:
        from lingcode.engine.local import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
