"""Scratch: the differences between cpu_client.py's points (us of the event loop's CPU)."""
import sys
d = {}
for line in open(sys.argv[1]):
    k, v = line.strip().split("=")
    d[k] = float(v)
def g(a, b): return d.get(b, 0) - d.get(a, 0)
print(f"app->handler {g('app','until_handler'):6.1f}  handler->engine {g('until_handler','until_engine'):6.1f}  engine->submit1 {g('until_engine','submit1'):6.1f}  chunk->write0 {g('chunk','write0'):6.1f}  app->write1 {g('app','write1'):7.1f}  ttft {d['ttft']:.3f}")
