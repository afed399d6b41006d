"""The CPU engine's resident memory does not grow with the number of prompt lengths it has seen.

torch's bf16 matmuls on the CPU build and cache a oneDNN kernel per input shape; with the default
cache sizes (1024) a daemon that prefills prompts of every length grew for good (the soak found
it). lingcode.engine.local caps the caches. This runs both ways in fresh
processes, on the engine's own prefill matmul shapes (widths 1..512 against the model's weights).
"""

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, random, sys
if sys.argv[1] == "engine":
    import lingcode.engine.local  # sets the caps, as the daemon does by loading the engine
import psutil, torch
torch.set_num_threads(2)
weights = [torch.randn(n, k).bfloat16() for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536))]
rss = lambda: psutil.Process().memory_info().rss / 2**20
widths = random.Random(0).sample(range(2, 513), 300)
def prefill(m):
    for w in weights:
        torch.nn.functional.linear(torch.randn(m, w.shape[1]).bfloat16(), w)
for m in widths[:100]:  # warm-up: the allocator settles and a capped cache fills
    prefill(m)
before = rss()
for m in widths[100:]:
    prefill(m)
print(json.dumps({"growth_mb": rss() - before, "caps": [os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ.get("LRU_CACHE_CAPACITY")]}))
"""


def probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prefill_shapes_do_not_grow_memory():
    capped = probe("engine")
    assert capped["caps"] == ["16", "16"]
    uncapped = probe("bare")
    if uncapped["growth_mb"] < 100:
        pytest.skip(f"this torch no longer caches a kernel per shape (uncapped growth {uncapped['growth_mb']:.0f} MB)")
    # 200 more new widths after the warm-up: hundreds of MB uncapped, nothing capped (the cache is full).
    assert capped["growth_mb"] < 16, (capped, uncapped)
