# call 1: the daemon's packages into /tmp/site, lingcode new (HEAD) and old (885af52) apart, the model's first part, the native step built
python3 --version; nproc; lscpu | grep -E "Model name|L3"; nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site /tmp/lc-new /tmp/lc-old /tmp/m /tmp/lh
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .dev/w/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --no-index --target /tmp/lc-new .dev/w/new/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --no-index --target /tmp/lc-old .dev/w/old/*.whl 2>&1 | tail -2
grep -c "def open" /tmp/lc-new/lingcode/server/serving.py /tmp/lc-old/lingcode/server/serving.py
cp .dev/m.aa .dev/prompts.jsonl /tmp/m/
mkdir -p /tmp/w && cd /tmp/w && PYTHONPATH=/tmp/lc-new:/tmp/site LINGCODE_HOME=/tmp/lh timeout 300 python3 -c 'from lingcode.engine.local import cpu_native; cpu_native.main()' 2>&1 | tail -2
PYTHONPATH=/tmp/site python3 -c "import httpx, aiohttp, torch; print(torch.__version__)"
