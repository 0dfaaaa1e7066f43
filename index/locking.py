"""The index's writer lock: one writer at a time (an :class:`~retriever.index.updates.IndexUpdater`,
a commit of a new generation, a build replacing the index), held with ``fcntl.flock`` on
``root/LOCK``, which holds the holder's pid (named in the error another writer gets)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from .errors import IndexLockedError

LOCK = "LOCK"


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold the index's writer lock (``root/LOCK``, ``flock``) for the block.

    Raises:
        IndexLockedError: another process (or another lock holder in this one) holds it; names
            the holder's pid.
    """
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise IndexLockedError(f"{root}: another writer holds the index (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
