"""From `lingcode chat ...` to a running ChatApp: the session store, the daemon link, the log file."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from lingcode import paths
from lingcode.client import DaemonLink
from lingcode.tui.app import ChatApp
from lingcode.tui.store import ChatStore


def log_file() -> Path:
    return paths.state_dir() / "chat.log"


def main(args: argparse.Namespace) -> int:
    # Textual owns the terminal, so lingcode's own logging goes to a file, never to the screen.
    logging.basicConfig(
        filename=paths.private_file(log_file()),
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        force=True,
    )
    store = ChatStore()
    resume: int | str | None = "last" if args.continue_ else None
    if args.resume is not None:
        if store.get(args.resume) is None:
            if store.recovered:  # the app will not start to show it: the reason the session is gone goes here
                print(f"lingcode: {store.recovered}", file=sys.stderr)
            print(
                f"lingcode: there is no chat session {args.resume}; `lingcode chat` then /sessions lists them",
                file=sys.stderr,
            )
            return 2
        resume = args.resume
    serve_args = ["--model", args.model] if args.model else []
    workdir = Path(args.workdir).expanduser() if args.workdir else Path.cwd()
    if not workdir.is_dir():
        print(f"lingcode: --workdir {workdir} is not a directory", file=sys.stderr)
        return 2
    app = ChatApp(
        link=DaemonLink(serve_args),
        store=store,
        workdir=workdir,
        resume=resume,
        agent=args.agent,
        system=args.system or "",
        max_tokens=args.max_tokens,
        temperature=args.temperature,
    )
    try:
        app.run()
    finally:
        store.close()
    return app.return_code or 0
