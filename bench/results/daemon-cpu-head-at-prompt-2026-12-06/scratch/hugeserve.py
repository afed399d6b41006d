import sys, os, threading
sys.path.insert(0, "/tmp/s31")
import huge
from lingcode.server import app as appmod
orig = appmod.create_app
def create_app(*a, **k):
    app = orig(*a, **k)
    if os.environ.get("HUGE") == "1":
        # after uvicorn starts serving, the heap has grown: collapse again a little later
        def later():
            import time; time.sleep(float(os.environ.get("HUGE_AFTER", "8")))
            huge.collapse(text=os.environ.get("HUGE_TEXT") == "1")
        threading.Thread(target=later, daemon=True).start()
    return app
appmod.create_app = create_app
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
