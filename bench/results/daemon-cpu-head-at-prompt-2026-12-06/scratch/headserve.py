"""Scratch: HEAD_EARLY=1 sends a stream's head once the engine has the request on the CPU too."""
import os, sys
from lingcode.engine.local import engine as E
if os.environ.get("HEAD_EARLY") == "1":
    orig = E.LocalEngine.__init__
    def init(self, *a, **k):
        orig(self, *a, **k)
        self.head_early = True
    E.LocalEngine.__init__ = init
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
