"""The one way the query side opens a file of an index directory.

An index directory may come from an untrusted source (copied, downloaded, unpacked from an
archive). Every file the reader touches is opened by :meth:`IndexFiles.open`, which

- takes a manifest-relative path whose components are plain names (no absolute path, ``..``,
  ``.``, empty component, NUL or backslash) and walks it one component at a time with
  ``openat(dir_fd, name, O_NOFOLLOW)``, so no symlink is followed anywhere on the way (a symlinked
  directory is refused just like a symlinked file) and the file is inside the index directory by
  construction, whatever the directory holds;
- opens the last component with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO in place of a file opens at
  once instead of blocking) and checks ``fstat`` + ``S_ISREG`` before any read or mmap
  (directories, FIFOs, sockets and devices are refused);
- requires the file to be listed in the manifest's ``files`` (when the caller has a manifest) and
  its size to be the listed size.

Errors are :class:`~retriever.index.errors.IndexFormatError` naming the file. Only the index root
itself is opened by its path as given (following a symlink there is the caller's choice).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import IndexFormatError

#: longest accepted manifest-relative path, and component (bytes of UTF-8)
MAX_REL_PATH = 1024
MAX_COMPONENT = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def check_rel(rel: Any, where: str) -> tuple[str, ...]:
    """The components of a manifest-relative path, validated.

    Args:
        rel: the path as the manifest gives it (must be a ``str``).
        where: the file that names it (for the message).

    Raises:
        IndexFormatError: not a string, empty, too long, absolute, or with a ``..`` / ``.`` /
            empty component, a NUL or a backslash (names ``where`` and the value).
    """
    if not isinstance(rel, str) or not rel:
        raise IndexFormatError(f"{where}: illegal path in manifest: {rel!r}")
    if len(rel.encode("utf-8", "surrogatepass")) > MAX_REL_PATH:
        raise IndexFormatError(f"{where}: path in manifest is longer than {MAX_REL_PATH} bytes: {rel[:64]!r}...")
    if rel.startswith("/") or "\\" in rel or "\x00" in rel:
        raise IndexFormatError(f"{where}: illegal path in manifest: {rel!r}")
    parts = tuple(rel.split("/"))
    for p in parts:
        if p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > MAX_COMPONENT:
            raise IndexFormatError(f"{where}: illegal path in manifest: {rel!r}")
    return parts


def _kind(mode: int) -> str:
    """A file type in words (for messages)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


@dataclass
class OpenedFile:
    """A regular file of the index, open for reading.

    Attributes:
        path: its path (for messages).
        fd: the open descriptor (owned: close it, or use the object as a context manager).
        size: its size in bytes (from ``fstat``).
    """

    path: Path
    fd: int
    size: int

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "OpenedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def read_all(self) -> bytes:
        """The whole file (``size`` bytes; a file that changed size while read is an error)."""
        chunks = []
        left = self.size
        pos = 0
        while left > 0:
            b = os.pread(self.fd, min(left, 1 << 24), pos)
            if not b:
                break
            chunks.append(b)
            pos += len(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) != self.size:
            raise IndexFormatError(f"{self.path}: file changed size while it was read")
        return data

    def map(self) -> Any:
        """A read-only memory map of the whole file (an ``mmap``; ``b""`` for an empty file).
        The map stays valid after :meth:`close`."""
        if self.size == 0:
            return b""
        try:
            return mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise IndexFormatError(f"{self.path}: cannot memory-map ({e})") from None


def open_regular(path: str | Path) -> OpenedFile:
    """Open one file by path with ``O_NOFOLLOW | O_NONBLOCK`` and check that it is a regular
    file (for files that are not read through a manifest: a format-1 index's manifest, the
    build side's own outputs). Symlinks in the directories above it are followed.

    Raises:
        IndexFormatError: missing, a symlink, or not a regular file (names it).
    """
    p = Path(path)
    try:
        fd = os.open(p, _FILE_FLAGS)
    except FileNotFoundError:
        raise IndexFormatError(f"{p}: index file is missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IndexFormatError(f"{p}: index files may not be symlinks") from None
        raise IndexFormatError(f"{p}: cannot open ({e.strerror})") from None
    return _checked(p, fd)


def _checked(p: Path, fd: int) -> OpenedFile:
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise IndexFormatError(f"{p}: cannot stat ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise IndexFormatError(f"{p}: is {_kind(st.st_mode)}, expected a regular file")
    return OpenedFile(p, fd, int(st.st_size))


class IndexFiles:
    """Opens the files of one index directory (see the module docstring for the rules).

    Args:
        root: the index directory.
        listed: the manifest's ``files`` (``{relative path: {"bytes", "sha256"}}``): every file
            opened with ``listed=True`` must be in it with that size; ``None`` before a manifest
            is read (``CURRENT``, the manifest itself).
        where: the manifest's path (named in messages about listing).
    """

    def __init__(self, root: str | Path, listed: Mapping[str, Any] | None = None, where: str | None = None) -> None:
        self.root = Path(root)
        self.listed = listed
        self.where = where or str(self.root)

    def path(self, rel: str) -> Path:
        """The path of ``rel`` below the root (validated; nothing is opened)."""
        return self.root.joinpath(*check_rel(rel, self.where))

    def open(self, rel: str, *, listed: bool = True, max_bytes: int | None = None) -> OpenedFile:
        """Open ``rel`` for reading.

        Args:
            rel: manifest-relative path (``/``-separated plain names).
            listed: the file must be in the manifest's ``files`` with its listed size (ignored
                when this object has no manifest).
            max_bytes: refuse larger files.

        Raises:
            IndexFormatError: an illegal path, a file not listed, missing, a symlink anywhere on
                the path, not a regular file, a size other than the listed one or above
                ``max_bytes`` (names the file).
        """
        parts = check_rel(rel, self.where)
        p = self.root.joinpath(*parts)
        entry = None
        if listed and self.listed is not None:
            entry = self.listed.get(rel)
            if not isinstance(entry, Mapping):
                raise IndexFormatError(f"{p}: the index reads this file but {self.where} does not list it "
                                       f"in 'files'")
        try:
            dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise IndexFormatError(f"{self.root}: index directory not found") from None
        except OSError as e:
            raise IndexFormatError(f"{self.root}: cannot open the index directory ({e.strerror})") from None
        try:
            for i, comp in enumerate(parts[:-1]):
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=dfd)
                except FileNotFoundError:
                    raise IndexFormatError(f"{p}: index file is missing") from None
                except OSError as e:
                    sub = self.root.joinpath(*parts[:i + 1])
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise IndexFormatError(f"{sub}: is a symlink or not a directory (index directories "
                                               f"may not be symlinks)") from None
                    raise IndexFormatError(f"{sub}: cannot open ({e.strerror})") from None
                os.close(dfd)
                dfd = nfd
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
            except FileNotFoundError:
                raise IndexFormatError(f"{p}: index file is missing") from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise IndexFormatError(f"{p}: index files may not be symlinks") from None
                raise IndexFormatError(f"{p}: cannot open ({e.strerror})") from None
        finally:
            os.close(dfd)
        f = _checked(p, fd)
        try:
            if entry is not None and f.size != entry.get("bytes"):
                raise IndexFormatError(f"{p}: size {f.size} bytes, manifest says {entry.get('bytes')} "
                                       f"(truncated or modified)")
            if max_bytes is not None and f.size > max_bytes:
                raise IndexFormatError(f"{p}: implausibly large ({f.size} bytes, at most {max_bytes} expected)")
        except BaseException:
            f.close()
            raise
        return f

    def read_bytes(self, rel: str, *, listed: bool = True, max_bytes: int | None = None) -> bytes:
        """The whole content of ``rel`` (see :meth:`open` for the checks)."""
        with self.open(rel, listed=listed, max_bytes=max_bytes) as f:
            return f.read_all()

    def map(self, rel: str, *, listed: bool = True) -> tuple[Path, Any]:
        """``(path, read-only memory map)`` of ``rel`` (see :meth:`open`, :meth:`OpenedFile.map`)."""
        with self.open(rel, listed=listed) as f:
            return f.path, f.map()

    def sha256(self, rel: str, *, listed: bool = True, chunk: int = 1 << 20) -> str:
        """Hex SHA-256 of ``rel``'s bytes (read through :meth:`open`)."""
        h = hashlib.sha256()
        with self.open(rel, listed=listed) as f:
            pos = 0
            while True:
                b = os.pread(f.fd, chunk, pos)
                if not b:
                    break
                h.update(b)
                pos += len(b)
        return h.hexdigest()

    def table(self, rel: str, *, full: bool = False) -> Any:
        """``rel`` as a memory-mapped, validated Arrow table (:func:`retriever.index.arrow_io.table_from_map`)."""
        from .arrow_io import table_from_map

        path, buf = self.map(rel)
        return table_from_map(path, buf, full=full)

    def arrays(self, rel: str, expected: Mapping[str, Any]) -> dict[str, Any]:
        """``rel`` as an array file (:func:`retriever.index.arrow_io.arrays_of_table`)."""
        from .arrow_io import arrays_of_table

        return arrays_of_table(self.path(rel), self.table(rel), expected)
