# call 1: the daemon's packages and lingcode's wheel into /tmp/site, the first half of the model and the inputs to /tmp/m, the native step built
set -x
python3 --version; nproc; lscpu | grep -E "Model name|L3"
mkdir -p /tmp/site /tmp/m /tmp/lh
python3 -m pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl 2>&1 | tail -2
cp .dev/gguf.aa .dev/prompts.jsonl .dev/idle.py /tmp/m/
mkdir -p /tmp/w && cd /tmp/w && PYTHONPATH=/tmp/site LINGCODE_HOME=/tmp/lh timeout 400 python3 -c 'from lingcode.engine.local import cpu_native; cpu_native.main()' 2>&1 | tail -2
python3 -c "import httpx, aiohttp, torch; print(torch.__version__)"
