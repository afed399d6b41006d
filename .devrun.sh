set -u
cat /tmp/m/part-aa .devmodel/b/part-ab > /tmp/m/model.gguf || exit 1
export LINGCODE_MODEL=/tmp/m/model.gguf LINGCODE_COMMIT=b700988
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cp -r .devextra/llama_cpp /tmp/site/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -s ../server lingcode/server; ln -s ../lsp lingcode/lsp; ln -s ../tui lingcode/tui
export LINGCODE_HOME=/tmp/lh; mkdir -p $LINGCODE_HOME/cache/models; ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
lscpu | grep "Model name" > $OUT/cpu-model.txt
(taskset -c 4-15 timeout -s TERM 390 python3 -m lingcode bench soak --device cuda --turns 1000 --out $OUT/soak-h200 > $OUT/soak.log 2>&1; echo "soak rc $?" >> $OUT/soak.log) &
taskset -c 0,1 timeout 400 python3 -m lingcode bench --device cpu --workload chat,completion,code-edit --speculation off,ngram --peers llama.cpp --requests 3 --out $OUT/cpu-2core 2>&1 | grep -v '━' > $OUT/cpu.log; echo "cpu rc $?" >> $OUT/cpu.log
wait
tail -5 $OUT/soak.log; tail -14 $OUT/cpu.log
