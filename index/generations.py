"""Manifest generations: commit a new immutable manifest and switch ``CURRENT`` to it atomically.

A generation is one manifest file ``manifests/NNNNNN.json``; ``CURRENT`` names the current one.
Committing generation N+1 writes its manifest beside the others (temporary name, fsync, rename),
then replaces ``CURRENT`` the same way (write ``CURRENT.tmp-…``, fsync, rename over ``CURRENT``,
fsync the directory). A crash before the last rename leaves generation N current and complete;
after it, N+1. Readers hold the manifest they opened, so they keep their snapshot (files listed
by a manifest are never modified; a file that a later generation no longer lists stays until a
compaction removes it, and memory maps of it stay valid). One writer at a time: ``LOCK`` is held
with ``fcntl.flock`` while committing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import IndexFormatError
from .locking import writer_lock
from .manifest_schema import parse_own_json
from .writer import _fsync_dir  # the one directory fsync of the build side
from .format import (CURRENT, MAX_MANIFEST_BYTES, check_manifest, format_version_of, manifest_digest,
                     manifest_name, read_current, read_manifest, sha256_file)

#: manifest fields a new generation may change (the rest is the parent's)
MUTABLE_FIELDS = ("shards", "files", "stats", "fusion", "metadata_schema", "build", "vocab")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by a temporary sibling, fsync, rename, fsync of the directory."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def file_entry(root: Path, rel: str) -> dict[str, Any]:
    """The manifest ``files`` entry (size, SHA-256) of the file ``root/rel``."""
    p = root / rel
    return {"bytes": p.stat().st_size, "sha256": sha256_file(p)}


def commit_generation(root: str | Path, *, parent: int, changes: Mapping[str, Any],
                      fault: Callable[[str], None] | None = None, lock_held: bool = False,
                      parent_manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Commit generation ``parent + 1``: the parent's manifest with ``changes`` applied.

    Args:
        root: index directory.
        parent: the generation the changes were made against; it must still be current
            (optimistic concurrency: a writer that lost a race gets an error, not a lost update).
        changes: new values of top-level manifest fields among :data:`MUTABLE_FIELDS` (``shards``
            with ``deletes`` / ``stats`` file names, ``files`` — every file the new generation
            lists, already written, fsynced and never to be modified —, ``fusion``, ...).
        fault: called with ``"generation_manifest"`` after the new manifest is durable and with
            ``"generation_current"`` after ``CURRENT`` is switched (fault injection in tests).
        lock_held: the caller already holds :func:`writer_lock` for ``root`` (an
            :class:`retriever.index.updates.IndexUpdater` holds it for its whole life).
        parent_manifest: generation ``parent``'s manifest as the caller read (or committed) it
            while holding the lock, instead of reading and validating it again (manifests are
            never modified once written); its ``generation`` must be ``parent``.

    Returns:
        the new manifest.

    Raises:
        IndexLockedError: another writer holds the index.
        IndexFormatError: ``parent`` is not current any more, an unknown field in ``changes``,
            or the new manifest does not validate (nothing is switched then).
    """
    root = Path(root)
    bad = sorted(set(changes) - set(MUTABLE_FIELDS))
    if bad:
        raise IndexFormatError(f"{root}: a generation cannot change {bad}; it may change {list(MUTABLE_FIELDS)}")
    with (contextlib.nullcontext() if lock_held else writer_lock(root)):
        current = read_current(root)
        if current != parent:
            raise IndexFormatError(f"{root}: generation {current} was committed after {parent}; "
                                   f"reopen the index and redo the change")
        if parent_manifest is not None and parent_manifest.get("generation") != parent:
            raise IndexFormatError(f"{root}: internal error, the parent manifest given is generation "
                                   f"{parent_manifest.get('generation')}, not {parent}; nothing was committed")
        m = dict(parent_manifest if parent_manifest is not None else read_manifest(root, parent))
        m.update(changes)
        m["format_version"] = format_version_of(m.get("shards", ()))  # the lowest that holds it
        m.pop("manifest_sha256", None)
        gen = parent + 1
        m["generation"] = gen
        m["parent_generation"] = parent
        m["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        rel = manifest_name(gen)
        try:
            m["manifest_sha256"] = manifest_digest(m)
            data = json.dumps(m, indent=1).encode("utf-8")
        except (TypeError, ValueError) as e:  # UnicodeError is a ValueError
            raise IndexFormatError(f"{root / rel}: the new manifest is not JSON a reader accepts ({e}); "
                                   f"nothing was committed") from None
        # the same checks as opening it, before anything is written (the parent's files, which
        # the caller checked under the lock it still holds, are not opened again): on the bytes
        # about to be written, parsed as a reader parses them, not read back from the file
        # (reading, scanning and re-hashing it took a third of a commit with 50 segments)
        if len(data) > MAX_MANIFEST_BYTES:
            raise IndexFormatError(f"{root / rel}: the new manifest would take {len(data)} bytes, more than "
                                   f"readers accept ({MAX_MANIFEST_BYTES}); compact the index "
                                   f"(fewer segments); nothing was committed")
        m = parse_own_json(root / rel, data)
        if m.get("manifest_sha256") != manifest_digest(m):  # e.g. int keys: sorted otherwise as strings
            raise IndexFormatError(f"{root / rel}: the new manifest's checksum would not match what a reader "
                                   f"parses (keys that are not strings?); nothing was committed")
        check_manifest(root, gen, m, checked=parent_manifest)
        _write_atomic(root / rel, data)
        if fault is not None:
            fault("generation_manifest")
        _write_atomic(root / CURRENT, (rel + "\n").encode("ascii"))
        if fault is not None:
            fault("generation_current")
        return m

