#!/usr/bin/env bash
# One H200 measurement: what the daemon adds to the engine (`lingcode bench daemon`, local engine
# and the SGLang adapter against its stand-in), the GPU tests of the embedded engine, and decode speed with and without drafts on each GPU kernel set
# (`lingcode bench`: the Triton step, the default, and the torch step), whose "same tokens" column
# is the lossless check: greedy drafts must give plain decoding's tokens.
# Run from the repo root on the GPU machine: bench/h200.sh OUTDIR [PARTS], PARTS a subset of
# "tests daemon one-process sglang kernels" (default: all; "daemon one-process" fit one 10-minute call).
# Needs: the default model's GGUF at $LINGCODE_MODEL, `lingcode` importable (the package's folders:
# lingcode/, with server/, lsp/, tui/ reachable as lingcode.server etc.), and pyproject.toml's
# dependencies that the machine lacks, carried as wheels (pip install --no-index --target DIR *.whl):
# gguf, platformdirs, fastapi (and its opentelemetry-api), starlette, uvicorn, httptools, pydantic,
# pydantic-core, typing-extensions, attrs, anyio, llguidance, pytest-asyncio, ...
# $LINGCODE_COMMIT names the commit measured (the machine's copy has no history).
# The GGUF (98 MB) outgrows one call's 64 MiB: carry it in two halves (`split -n 2`) in two calls,
# the first copying its half to /tmp.
set -uo pipefail
out=${1:-bench/results}
parts=${2:-tests daemon one-process sglang kernels}
mkdir -p "$out"
export LINGCODE_HOME=${LINGCODE_HOME:-/tmp/lingcode-home}
# A copy that pip did not install lacks pyproject's package-dir mapping of server/, lsp/ and tui/.
python3 -c 'import lingcode.server' 2>/dev/null || for d in server lsp tui; do ln -sfn ../$d lingcode/$d; done
mkdir -p "$LINGCODE_HOME/cache/models"
ln -sf "$LINGCODE_MODEL" "$LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONUNBUFFERED=1
stamp=$(date -u +%Y-%m-%d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$out/gpu.txt"

if [[ $parts == *daemon* ]]; then
echo "== the daemon's overhead (local engine, default kernels)"
timeout 280 python3 -m lingcode bench daemon --device cuda --workload chat,code-edit --requests 5 --max-tokens 512 \
  --speculation off,ngram --out "$out/daemon-h200-$stamp" > "$out/daemon-h200.log" 2>&1
fi
if [[ $parts == *one-process* ]]; then
echo "== the same with the engine in the daemon's process (on a GPU it has one of its own by default)"
timeout 280 python3 -m lingcode bench daemon --device cuda --workload chat,code-edit --requests 5 --max-tokens 512 \
  --speculation off,ngram --serve-env LINGCODE_ENGINE_PROCESS=0 --out "$out/daemon-h200-one-process-$stamp" \
  > "$out/daemon-h200-one-process.log" 2>&1
fi
if [[ $parts == *sglang* ]]; then
echo "== the SGLang adapter against its stand-in"
timeout 120 python3 -m lingcode bench daemon --engine sglang --workload chat,code-edit --requests 5 --max-tokens 512 \
  --out "$out/daemon-sglang-h200host-$stamp" > "$out/daemon-sglang.log" 2>&1
fi

if [[ $parts == *tests* ]]; then
echo "== GPU tests"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee "$out/gpu-tests.txt"

fi

if [[ $parts == *kernels* ]]; then
echo "== decode speed and losslessness per kernel set"
for kernels in triton torch; do
  timeout 140 python3 -m lingcode bench --device cuda --kernels $kernels --workload chat,code-edit \
    --speculation off,ngram --requests 3 --max-tokens 256 --out "$out/h200-$kernels-$stamp" 2>&1 \
    | grep -v '━' > "$out/bench-$kernels.txt"
done
fi
for f in "$out"/daemon-*"$stamp".md "$out"/h200-*"$stamp".md; do echo "-- $f"; sed -n '/^|/p' "$f" | head -12; done
