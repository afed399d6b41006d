set -u
mkdir -p /tmp/m && cp .devmodel/a/part-aa /tmp/m/
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
cd bench && LINGCODE_MODEL=random taskset -c 4-15 timeout 200 python3 triton_vs_torch.py 2>&1 | tail -16
