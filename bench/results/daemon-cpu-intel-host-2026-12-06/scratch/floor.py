import asyncio, subprocess, sys, time, statistics, socket
sys.path.insert(0, "/work/main")
from lingcode.bench.daemon import _clients, through_daemon, _free_port
async def main():
    port = _free_port()
    p = subprocess.Popen([sys.executable, "-m", "lingcode.bench.daemon", str(port)])
    for _ in range(100):
        try: socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
        except OSError: time.sleep(0.1)
    cl = _clients(f"http://127.0.0.1:{port}", {"Authorization": "Bearer x"}, ["httpx", "aiohttp"])
    msgs = [{"role": "user", "content": "hello there"}]
    for name, c in cl.items():
        ts = []
        for i in range(60):
            ttft, *_ = await through_daemon(c, msgs, 16)
            ts.append(ttft); await asyncio.sleep(0.01)
        ts = ts[5:]
        print(name, "floor median %.2f ms p10 %.2f p90 %.2f" % (statistics.median(ts), sorted(ts)[5], sorted(ts)[-6]))
    p.terminate()
asyncio.run(main())
