set -u
cat /tmp/m/part-aa .devmodel/b/part-ab > /tmp/m/model.gguf || exit 1
export LINGCODE_MODEL=/tmp/m/model.gguf LINGCODE_COMMIT=$(cat .devcommit)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -s ../server lingcode/server; ln -s ../lsp lingcode/lsp; ln -s ../tui lingcode/tui
export LINGCODE_HOME=/tmp/lh; mkdir -p $LINGCODE_HOME/cache/models; ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
G="taskset -c 4-15"
(echo "commit $LINGCODE_COMMIT"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) > $OUT/h200-gpu-tests.txt
$G timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py >> $OUT/h200-gpu-tests.txt 2>&1; echo "rc $?" >> $OUT/h200-gpu-tests.txt; grep -E "passed|failed|^E  " $OUT/h200-gpu-tests.txt | head -8
$G timeout 200 python3 -m lingcode bench --device cuda --kernels triton --workload random,chat,code-edit --speculation off --peers transformers-static --requests 3 --max-tokens 256 --out $OUT/h200-triton 2>&1 | grep -v '━' | tail -7
$G timeout 80 python3 -m lingcode bench --device cuda --kernels triton --workload code-edit,chat --speculation off,ngram --requests 3 --max-tokens 256 --out $OUT/h200-triton-ngram 2>&1 | grep -v '━' | tail -5
$G timeout 80 python3 -m lingcode bench --device cuda --workload code-edit --speculation off,ngram --requests 3 --max-tokens 256 --out $OUT/h200-torch-ngram 2>&1 | grep -v '━' | tail -3
rm -f $OUT/*.png; ls $OUT
