"""Per-segment derived state, reused when a reader moves to a newer generation.

Segments (shard directories) are immutable once a manifest lists them, so what a leg derives from
one at open (checked postings, membership bitmaps, FAISS indexes, sparse arrays, the vocabulary)
stays valid for every generation that lists the segment. :meth:`retriever.Retriever.refresh` keeps
one :class:`SegmentCache` across generations: a refresh after a small commit loads only the new
segments (what depends on corpus-wide statistics, such as BM25 bounds, is carried from the
previous generation: :mod:`retriever.legs.bm25_carry`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

from .shards import IndexReader, Shard


def segment_key(reader: IndexReader, shard: Shard, name: str) -> tuple[str, str, str | None]:
    """A key that names a segment's file by content: the shard directory, the file name and its
    SHA-256 from the manifest (a directory name reused after a crash never matches stale state)."""
    rel = f"{shard.entry['dir']}/{name}"
    info = reader.manifest["files"].get(rel)
    return (str(shard.dir), name, None if info is None else info["sha256"])


class SegmentCache:
    """Derived per-segment values by key, built once (thread-safe).

    :meth:`get` returns the cached value or builds it; :meth:`retain` drops every key not used
    since the last :meth:`mark` (what the previous generation needed and the current one does
    not). A cache is owned by one :class:`retriever.Retriever`; what a value holds for a
    generation is never modified once made (a value may keep, behind its own lock, a record of
    the newest state derived from it, as :class:`retriever.legs.bm25_carry.SegmentState` does),
    so an older snapshot sharing them keeps working.
    """

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._used: set[Hashable] = set()
        self._lock = threading.Lock()
        #: values built / reused since the last :meth:`mark` (for tests and benchmarks)
        self.built = 0
        self.reused = 0

    def peek(self, key: Hashable) -> Any:
        """The cached value of ``key`` or None (does not mark it used)."""
        with self._lock:
            return self._values.get(key)

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value of ``key``, built with ``make()`` on first use."""
        with self._lock:
            if key in self._values:
                self._used.add(key)
                self.reused += 1
                return self._values[key]
        value = make()
        with self._lock:
            value = self._values.setdefault(key, value)
            self._used.add(key)
            self.built += 1
        return value

    def put(self, key: Hashable, value: Any) -> None:
        """Set the value of ``key`` (replacing any; marks it used): a running value that each
        generation derives from the previous one's, such as combined statistics."""
        with self._lock:
            self._values[key] = value
            self._used.add(key)

    def mark(self) -> None:
        """Start counting uses (before a generation's legs are loaded)."""
        with self._lock:
            self._used = set()
            self.built = self.reused = 0

    def retain(self) -> None:
        """Drop the values not used since :meth:`mark`."""
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if k in self._used}

    def __len__(self) -> int:
        return len(self._values)
