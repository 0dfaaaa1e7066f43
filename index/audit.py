"""What ``retriever index verify`` checks beyond checksums: the directory holds nothing else.

The reader opens only files its manifest lists (:mod:`retriever.index.safe_open`), so an extra
file is never read. But a copy that holds extra files, symlinks or special files is not the index
that was built, and a person verifying a downloaded index should hear about it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .format import CURRENT, MANIFEST_DIR, MANIFEST_NAME_RE, MAX_MANIFEST_BYTES
from .manifest_schema import parse_json_limited
from .safe_open import IndexFiles

#: index-level files that no manifest lists
FIXED_FILES = (CURRENT, "LOCK")


def listed_files(root: Path) -> set[str]:
    """Every file any generation's manifest of ``root`` lists (manifests that cannot be read are
    skipped: the verification of the current generation reports what is wrong with it)."""
    out: set[str] = set()
    mdir = root / MANIFEST_DIR
    if not mdir.is_dir() or mdir.is_symlink():
        return out
    files = IndexFiles(root)
    for name in sorted(os.listdir(mdir)):
        rel = f"{MANIFEST_DIR}/{name}"
        if not MANIFEST_NAME_RE.match(rel):
            continue
        try:
            m = parse_json_limited(root / rel, files.read_bytes(rel, listed=False, max_bytes=MAX_MANIFEST_BYTES))
        except Exception:  # noqa: BLE001 - unreadable manifests are reported elsewhere
            continue
        if isinstance(m, dict) and isinstance(m.get("files"), dict):
            out.update(k for k in m["files"] if isinstance(k, str))
    return out


def audit_directory(root: str | Path) -> list[str]:
    """Problems of the directory tree of the index at ``root``, one message per entry: symlinks
    (to files or directories, wherever they point), FIFOs, sockets and devices, and regular
    files that no generation's manifest lists and that are not ``CURRENT``, ``LOCK`` or a
    generation manifest. Symlinked directories are not entered.

    Returns:
        the messages, each naming the path (empty: nothing found).
    """
    root = Path(root)
    known = listed_files(root)
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            p = base / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{p}: a symlink (to {os.readlink(p)!r}); index files and directories may not be "
                                f"symlinks")
            elif stat.S_ISDIR(st.st_mode):
                continue
            elif not stat.S_ISREG(st.st_mode):
                problems.append(f"{p}: not a regular file (a FIFO, socket or device)")
            elif rel not in known and rel not in FIXED_FILES and not MANIFEST_NAME_RE.match(rel):
                problems.append(f"{p}: not listed in any manifest (a file the index does not use)")
        dirnames[:] = [d for d in dirnames if not os.path.islink(base / d)]
    return problems
