# call 1: the daemon's packages, the openai SDK and lingcode's wheel into /tmp/site, the first half of the model and the inputs to /tmp/m
python3 --version; nproc; lscpu | grep -E "Model name|L3"; nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site /tmp/m /tmp/lh
python3 -m pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl 2>&1 | tail -2
cp .dev/gguf.aa .dev/prompts.jsonl /tmp/m/
PYTHONPATH=/tmp/site python3 -c "import httpx, aiohttp, openai, torch, triton; print(torch.__version__, openai.__version__, triton.__version__)"
