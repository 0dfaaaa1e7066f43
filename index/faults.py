"""Fault injection: a hook that the writer and the leg builders call at named points of a build.

Production code never looks for faults itself: ``build_index(..., faults=hook)`` (and
:class:`retriever.index.writer.IndexWriter`, :func:`retriever.index.upgrade.upgrade_index`) pass
one callable down, called as ``hook(point)`` at each point of :data:`CRASH_POINTS`; the default
does nothing. Crash-safety tests pass a hook that kills the process at one point (SIGKILL) and
check that no partial index ever becomes visible and an existing one is never damaged.
"""

from __future__ import annotations

from typing import Callable

#: ``hook(point)``: called at each named point; may raise or kill the process (tests only)
FaultHook = Callable[[str], None]

#: Every named point, in build order (tests iterate over this tuple).
CRASH_POINTS = (
    "read",             # pipeline: a batch was read and validated
    "encode_bm25",      # BM25 builder: a batch was analysed into postings
    "encode_dense",     # dense builder: a batch was encoded (or taken from the precomputed vectors)
    "shard_docs",       # writer: docs.arrow of a shard written
    "shard_bm25",       # BM25 builder: bm25.arrow (postings) of a shard written
    "faiss",            # dense builder: a shard's FAISS index was built (non-Flat factory)
    "shard_dense",      # dense builder: dense.arrow of a shard written
    "shard_faiss",      # dense builder: dense.faiss of a shard written
    "shard_done",       # writer: a shard complete (directory fsynced)
    "vocab",            # BM25 builder: vocab.arrow written
    "manifest",         # writer: stats files, manifest and CURRENT written and fsynced, before the rename
    "swap",             # writer: new index renamed/swapped into place, old not yet deleted
)


def no_faults(point: str) -> None:
    """The default hook: does nothing."""

#: The points of a living index's writer (:class:`retriever.index.updates.IndexUpdater`), besides
#: the build points its leg builders and segment writer reach (``encode_*``, ``shard_*``,
#: ``faiss``) and :func:`retriever.index.generations.commit_generation`'s two.
UPDATE_CRASH_POINTS = (
    "shard_docs",           # a new segment's docs.arrow written
    "shard_bm25",           # its bm25.arrow written
    "shard_done",           # a new segment complete
    "update_segments",      # every segment of an add (or of a compaction run) complete
    "compact_segment",      # a compaction run rewritten
    "update_deletes",       # the tombstone files of a commit written
    "update_vocab",         # the commit's vocabulary file written
    "generation_manifest",  # the new manifest durable, CURRENT not switched yet
    "generation_current",   # CURRENT switched
    "update_clean",         # old generations' files removed
)
