import httpx, json, time, sys, os, inspect, argparse, difflib, pathlib, textwrap
port = int(sys.argv[1]); tok = open(sys.argv[2]).read().strip(); kb = int(sys.argv[3])
h = {"Authorization": f"Bearer {tok}", "x-lingcode-trace": "1"}
src = inspect.getsource(argparse) + inspect.getsource(difflib)
msgs = [{"role": "system", "content": "You are a coding agent."}]
i = 0
while sum(len(m["content"]) for m in msgs) < kb * 1024:
    msgs.append({"role": "user", "content": "Look at this:\n" + src[i * 1500:(i + 1) * 1500]})
    msgs.append({"role": "assistant", "content": "I read it. " + src[(i + 1) * 1500:(i + 1) * 1500 + 300]})
    i += 1
msgs.append({"role": "user", "content": "Summarize."})
body = {"model": "x", "messages": msgs, "max_tokens": 4, "stream": True, "temperature": 0}
with httpx.Client(headers=h, timeout=120) as c:
    for rep in range(4):
        t0 = time.perf_counter(); first = None; last = None
        with c.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if first is None and '"content"' in line: first = time.perf_counter()
                if "timings" in line: last = line
        tr = json.loads(last[6:]).get("timings", {}) if last else {}
        t = tr.get("trace", {})
        print(f"{len(json.dumps(body))//1024} KB, {len(msgs)} msgs, prompt_tokens {tr.get('prompt_tokens')} cached {tr.get('cached_tokens')}: client ttft {(first-t0)*1e3:.2f} ms", {k: t[k] for k in ("until_handler","body","validate","prompt","until_engine","engine_first_chunk","until_first_events") if k in t})
