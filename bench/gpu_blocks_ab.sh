#!/bin/bash
# The Triton step on GGUF blocks, before and after a kernel change, in one call on a GPU machine:
# bench/gpu_blocks.py against main's library (a copy in .whl/base: `git archive main lingcode bench`)
# for every shape's blocks, then against this tree (checks and every shape), then this tree with other
# settings (AB_SETTINGS: NAME=VALUE environment settings the library under test reads, such as
# the h61-gpu-streamed branch's LINGCODE_CHUNK). .whl/site: platformdirs, which the lent machines lack.
#   bash bench/gpu_blocks_ab.sh OUTDIR
OUT=${1:-/tmp/gpu_blocks_ab}
mkdir -p "$OUT"
export BUDGET_S=${BUDGET_S:-250}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -d .whl/base/lingcode ]; then
  PYTHONPATH=.whl/base:.whl/site SPEED_ONLY=1 KERNELS=triton-blocks VARIANTS='[]' \
    timeout ${BASE_S:-150} python3 bench/gpu_blocks.py "$OUT/base" > "$OUT/base.log" 2>&1
  tail -n 25 "$OUT/base.log"
fi
PYTHONPATH=.:.whl/site timeout ${NEW_S:-300} python3 bench/gpu_blocks.py "$OUT/new" > "$OUT/new.log" 2>&1
tail -n 60 "$OUT/new.log"
for setting in ${AB_SETTINGS:-LINGCODE_STAGES=2}; do
  name=${setting//=/-}
  env $setting PYTHONPATH=.:.whl/site SPEED_ONLY=1 SHAPES=qwen2.5-coder-1.5b KERNELS=triton-blocks VARIANTS='[]' \
    timeout ${SETTING_S:-80} python3 bench/gpu_blocks.py "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "== $setting"; grep -E "triton-blocks|Error|error" "$OUT/$name.log" | tail -n 8
done
