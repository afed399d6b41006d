set -u
cat /tmp/m/part-aa .devmodel/b/part-ab > /tmp/m/model.gguf || exit 1
export LINGCODE_MODEL=/tmp/m/model.gguf LINGCODE_COMMIT=$(cat .devcommit)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cp -r .devextra/llama_cpp /tmp/site/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -s ../server lingcode/server; ln -s ../lsp lingcode/lsp; ln -s ../tui lingcode/tui
export LINGCODE_HOME=/tmp/lh; mkdir -p $LINGCODE_HOME/cache/models; ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
lscpu | grep "Model name" > $OUT/cpu-model.txt
taskset -c 0,1 timeout 370 python3 -m lingcode bench --device cpu --compile --workload code-edit --speculation off,ngram --peers llama.cpp --requests 3 --out $OUT/cpu-2core-compile 2>&1 | grep -v '━' > $OUT/cpu.log; echo "cpu rc $?" >> $OUT/cpu.log
tail -8 $OUT/cpu.log; rm -f $OUT/*.png
