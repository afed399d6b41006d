"""Scratch: NOWATCH=1 awaits the work without the disconnect watcher (the bound of what the watcher costs)."""
import sys, os
from lingcode.server import serving
if os.environ.get("NOWATCH") == "1":
    async def until_disconnected(request, work):
        return await work
    serving.until_disconnected = until_disconnected
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
