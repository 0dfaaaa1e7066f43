"""Test-only fault injection: simulate a hard crash (SIGKILL) at a named point of a build.

``RETRIEVER_CRASH_AT=<name>[:<n>]`` makes the *n*-th (default first) call of
``crash_point(<name>)`` in this process kill the process with SIGKILL, so tests can check that a
build dying at any point leaves no visible partial index and never damages an existing one
(tests/test_reliability.py). Unset (the normal case) it costs one dict lookup. Never set it in
production. Points: see ``CRASH_POINTS``.
"""

from __future__ import annotations

import os
import signal

#: Every named point, in pipeline order (tests iterate over this list).
CRASH_POINTS = (
    "read",             # pipeline: a batch was read and validated
    "encode_bm25",      # pipeline: a batch was analysed into postings
    "encode_dense",     # pipeline: a batch was encoded by the dense model
    "faiss",            # pipeline: a shard's FAISS index was built (non-Flat factory)
    "shard_docs",       # writer: docs.arrow of a shard written
    "shard_bm25",       # writer: bm25.arrow (postings) of a shard written
    "shard_dense",      # writer: dense.arrow of a shard written
    "shard_faiss",      # writer: dense.faiss of a shard written
    "shard_done",       # writer: a shard complete (directory fsynced)
    "vocab",            # writer: vocab.arrow written
    "manifest_partial", # writer: half of manifest.json written (not yet fsynced)
    "manifest",         # writer: manifest.json written and fsynced, before the rename
    "swap",             # writer: new index renamed/swapped into place, old not yet deleted
)

_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process if ``RETRIEVER_CRASH_AT`` names this point (test-only)."""
    spec = os.environ.get("RETRIEVER_CRASH_AT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= (int(nth) if nth else 1):
        os.kill(os.getpid(), signal.SIGKILL)
