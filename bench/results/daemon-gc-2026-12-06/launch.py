"""lingcode serve with every GC collection timed (gen, ms, tracked objects), written to $GC_LOG on each gen-2 collection and at exit."""
import atexit, gc, json, os, sys, time
log, start = [], {}
def cb(phase, info):
    if phase == "start":
        start["t"] = time.perf_counter()
    else:
        log.append((info["generation"], (time.perf_counter() - start["t"]) * 1e3, time.perf_counter(), len(gc.get_objects(2)) if info["generation"] == 2 else 0))
        if info["generation"] == 2:
            dump()
def dump():
    with open(os.environ["GC_LOG"], "w") as f:
        json.dump(log, f)
gc.callbacks.append(cb)
atexit.register(dump)
if os.environ.get("GC_FREEZE_PATCH"):
    import lingcode.server.daemon as d
    orig = d._run_uvicorn
    def run(*a, **k):
        gc.collect(); gc.freeze()
        return orig(*a, **k)
    d._run_uvicorn = run
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
