#!/usr/bin/env bash
# One whole H200 measurement in one invocation (< 10 minutes): the GPU tests of the embedded
# engine, `lingcode bench` with speculation modes and transformers side by side (the torch step,
# then the Triton step), and the 1,000-turn soak.
# Run from the repo root on the GPU machine: bench/h200.sh OUTDIR
# Needs: the default model's GGUF at $LINGCODE_MODEL, and these wheels importable (the machine
# has torch, transformers, tokenizers, numpy, jinja2, rich, matplotlib): gguf, platformdirs,
# pytest>=8.2 and pytest-asyncio, xgrammar (the constrained-decoding test), and the daemon's own
# dependencies for the soak (pyproject.toml: fastapi, uvicorn, httpx, pygls, prometheus-client, ...).
# With no registry on the machine, carry them as wheels: pip install --no-index --target DIR *.whl.
set -uo pipefail
out=${1:-bench/results}
mkdir -p "$out"
export LINGCODE_HOME=${LINGCODE_HOME:-/tmp/lingcode-home}
mkdir -p "$LINGCODE_HOME/cache/models"
ln -sf "$LINGCODE_MODEL" "$LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$out/gpu.txt"

echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/gpu-tests.txt"

echo "== bench, torch step"
stamp=$(date -u +%Y-%m-%d)
python3 -m lingcode bench --device cuda --kernels torch --workload random,chat,code-edit --speculation off,ngram \
  --peers transformers-eager,transformers-static --requests 3 --max-tokens 256 \
  --out "$out/h200-$stamp" 2>&1 | grep -v '━' | tee "$out/bench.txt"

echo "== bench, Triton step (the default on a GPU)"
python3 -m lingcode bench --device cuda --kernels triton --workload random,chat,code-edit --speculation off,ngram \
  --peers transformers-static --requests 3 --max-tokens 256 \
  --out "$out/h200-$stamp-triton-bench" 2>&1 | grep -v '━' | tee "$out/bench-triton.txt"

echo "== soak"
python3 -m lingcode bench soak --device cuda --turns 1000 --out "$out/soak-h200-$stamp" 2>&1 | tail -12
