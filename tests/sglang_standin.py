"""A stand-in for `python -m sglang.launch_server`, for the supervisor's tests (stdlib only).

It is not SGLang and serves no model. It behaves like the process the supervisor manages, in the
ways the supervisor depends on: it takes SGLang's argv (`-m sglang.launch_server ... --port N`),
prints loading progress the way tqdm does (carriage returns), starts a "TP worker" child in its
process group (one that ignores SIGTERM, like a stuck worker), answers GET /health_generate with
503 while "loading" and 200 after, replays SGLang's /generate wire format (tests/sglang_wire.py),
and dies with exit code 3 on POST /die, leaving its worker orphaned, as a crashed server does.

Configured by environment variables: STANDIN_DIR (where it records each start: starts.txt with
one pid per line, workers.txt with each worker's pid), STANDIN_LOAD_S (seconds of "loading"),
STANDIN_CRASH_FROM (from this start on, exit 1 while loading).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import sglang_wire as wire  # noqa: E402

WORKER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"


def main(argv: list[str]) -> None:
    assert argv[:2] == ["-m", "sglang.launch_server"], argv
    port = int(argv[argv.index("--port") + 1])
    state = Path(os.environ["STANDIN_DIR"])
    with open(state / "starts.txt", "a") as f:
        f.write(f"{os.getpid()}\n")
    start_no = len((state / "starts.txt").read_text().split())
    worker = subprocess.Popen([sys.executable, "-c", WORKER])  # same process group, like TP workers
    with open(state / "workers.txt", "a") as f:
        f.write(f"{worker.pid}\n")

    replay = wire.Replay(generate=lambda rid, body: "endless")
    replay.healthy = False
    Handler = wire.handler(replay)

    class StandIn(Handler):
        def do_POST(self) -> None:
            if self.path == "/die":
                os._exit(3)
            super().do_POST()

    from http.server import ThreadingHTTPServer
    import threading

    server = ThreadingHTTPServer(("127.0.0.1", port), StandIn)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    load_s = float(os.environ.get("STANDIN_LOAD_S", "0.3"))
    crash_from = int(os.environ.get("STANDIN_CRASH_FROM", "0"))
    for step in range(5):
        print(f"Loading safetensors checkpoint shards: {step * 25}% Completed | {step}/4\r", end="", flush=True)
        time.sleep(load_s / 5)
        if crash_from and start_no >= crash_from and step == 2:
            print("\nRuntimeError: CUDA error: out of memory (stand-in)", flush=True)
            sys.exit(1)
    print("Loading safetensors checkpoint shards: 100% Completed | 4/4", flush=True)
    replay.healthy = True
    print("The server is fired up and ready to roll!", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
