"""Scratch: profile the daemon's loop thread from a POST's first bytes to the engine's _start."""
import cProfile, pstats, sys, atexit, signal, os
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from lingcode.engine.local.engine import LocalEngine

prof = cProfile.Profile()
state = {"on": False, "n": 0}
orig_dr = HttpToolsProtocol.data_received
def data_received(self, data):
    if data.startswith(b"POST /v1/chat") and not state["on"]:
        state["on"] = True
        prof.enable()
    return orig_dr(self, data)
HttpToolsProtocol.data_received = data_received
orig_start = LocalEngine._start
def _start(self, *a, **k):
    if state["on"]:
        prof.disable(); state["on"] = False; state["n"] += 1
    return orig_start(self, *a, **k)
LocalEngine._start = _start
def dump(*_):
    st = pstats.Stats(prof); st.dump_stats("/tmp/s31/prof.out")
    print("requests profiled", state["n"], file=sys.stderr)
atexit.register(dump)
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
