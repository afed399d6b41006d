import json, os, subprocess, sys, time, tempfile, pathlib, httpx
sys.path.insert(0, "/work/main")
from lingcode.bench import share_kernels
from lingcode import models
home = pathlib.Path(tempfile.mkdtemp(prefix="prof-")); share_kernels(home)
env = {**os.environ, "LINGCODE_HOME": str(home)}
gguf = models.ensure("smollm2-135m-instruct") if len(sys.argv) < 3 else sys.argv[2]
p = subprocess.Popen([sys.executable, "-m", "lingcode", "serve", "--port", "0", "--device", "cpu", "--speculation", "off", "--model", str(gguf)],
                     env=env, stdout=open(home / "serve.log", "w"), stderr=subprocess.STDOUT)
rec = home / "state" / "daemon.json"
while not rec.exists(): time.sleep(0.2)
info = json.loads(rec.read_text()); tok = pathlib.Path(info["token_file"]).read_text().strip()
c = httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {tok}", "x-lingcode-trace": "1"}, timeout=600)
body = {"messages": [{"role": "user", "content": "Write a Python function that merges two sorted lists."}], "max_tokens": 128,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
def one():
    tr = None
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                if d.get("choices") and d["choices"][0].get("finish_reason"): tr = d.get("timings", {}).get("trace")
    return tr
for _ in range(3): one()
spy = None
if sys.argv[1] == "spy":
    spy = subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "--pid", str(p.pid), "--rate", "500", "--threads", "--format", "raw",
                            "--output", "/tmp/s28/prof/loop.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
cpus = []
for i in range(int(os.environ.get("N", "20"))):
    tr = one(); cpus.append(tr); time.sleep(float(os.environ.get("GAP", "0.05")))
import statistics
print({k: round(statistics.median(t.get(k, 0) for t in cpus), 3) for k in tr if k != "arrived_at"})
if spy: spy.send_signal(2); spy.wait()
p.terminate(); p.wait()
