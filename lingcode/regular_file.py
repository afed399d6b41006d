"""Reading a file that a client named: a regular file, of bounded size, and never a blocking open.

A path from an editor or a model may name a FIFO (open() waits for a writer, forever), a device
(/dev/zero never ends) or a file of gigabytes. The LSP and the agent's file tools read through
here instead: the open cannot block (O_NONBLOCK; it changes nothing for a regular file), and what
was opened is checked before a byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnreadableFile(OSError):
    """Not a regular file, or larger than the caller takes; the message says which."""


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of `path`; UnreadableFile if it is no regular file or holds more than max_bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFile(f"{path} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path} is not a regular file (a FIFO, socket or device)")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{path} has {info.st_size} bytes, over the limit of {max_bytes}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while we read
        raise UnreadableFile(f"{path} has over {max_bytes} bytes, the limit")
    return data
