"""Arrow IPC files of an index: writing them, and validating a memory-mapped table (magic bytes,
buffer sizes, string offsets) and the one-row array files. No file is opened here: the reader opens
files through :mod:`retriever.index.safe_open` and hands the maps in (so this module and
``safe_open`` do not import each other)."""

from __future__ import annotations

import os

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from .errors import IndexFormatError


def write_table(path: Path, table: pa.Table, *, sync: bool = True) -> None:
    """Write ``table`` as an uncompressed Arrow IPC file and fsync it (``sync=False``: the caller
    fsyncs it before any manifest lists it)."""
    with open(path, "wb") as f:
        with pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def table_bytes(table: pa.Table) -> pa.Buffer:
    """The bytes of the uncompressed Arrow IPC file of ``table`` (what :func:`write_table` writes),
    in memory: a writer can hash them and write them on another thread without reading the file
    back."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


ARROW_MAGIC = b"ARROW1"


def _check_array_offsets(path: Path, name: str, arr: pa.Array) -> None:
    """Offsets of one array (and of its children: struct fields, list values, extension storage)."""
    typ = arr.type
    if isinstance(typ, pa.BaseExtensionType):
        _check_array_offsets(path, name, arr.storage)
        return
    if pa.types.is_struct(typ):
        for i in range(typ.num_fields):
            _check_array_offsets(path, f"{name}.{typ.field(i).name}", arr.field(i))
        return
    is_str = (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
              or pa.types.is_large_binary(typ))
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    if not (is_str or is_list):
        return
    large = pa.types.is_large_string(typ) or pa.types.is_large_binary(typ) or pa.types.is_large_list(typ)
    odt = np.int64 if large else np.int32
    bufs = arr.buffers()
    if len(arr) and bufs[1] is not None:
        n_off = arr.offset + len(arr) + 1
        if bufs[1].size < n_off * np.dtype(odt).itemsize:
            raise IndexFormatError(f"{path}: column {name!r} has a truncated offsets buffer")
        off = np.frombuffer(bufs[1], dtype=odt, count=n_off)[arr.offset:]
        limit = (0 if bufs[2] is None else bufs[2].size) if is_str else len(arr.values)
        if off[0] < 0 or off[-1] > limit or (len(off) > 1 and (np.diff(off) < 0).any()):
            raise IndexFormatError(f"{path}: column {name!r} has corrupted offsets")
    if is_list:
        _check_array_offsets(path, name, arr.values)


def _check_offsets(path: Path, table: pa.Table) -> None:
    """O(rows) check of the offsets of every string, binary and list column, nested ones included
    (monotone, inside the data buffer), so a corrupted offset can never make a later read leave
    the buffer. UTF-8 content is not scanned here (``verify`` covers payload bytes)."""
    for name, col in zip(table.column_names, table.columns):
        for chunk in col.chunks:
            _check_array_offsets(path, name, chunk)


def table_from_map(path: Path, buf: Any, *, full: bool = False) -> pa.Table:
    """An Arrow IPC file's table from its memory map (zero-copy), validated.

    Checks the Arrow magic bytes at both ends, Arrow's own buffer-size validation and the offsets
    of string columns (all O(rows) at most; payload bytes are left to ``verify``). ``full``: also
    Arrow's full validation (UTF-8 of every string; O(bytes)) for small files read whole.

    Raises:
        IndexFormatError: structurally corrupted file (names it).
    """
    size = len(buf)
    if size < 14 or bytes(buf[:6]) != ARROW_MAGIC or bytes(buf[size - 6:]) != ARROW_MAGIC:
        raise IndexFormatError(f"{path}: not an Arrow IPC file (bad magic bytes or truncated)")
    try:
        table = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(buf))).read_all()
        table.validate(full=full)
        _check_offsets(path, table)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as e:  # UnicodeDecodeError is a ValueError
        if isinstance(e, IndexFormatError):
            raise
        raise IndexFormatError(f"{path}: not a valid Arrow IPC file ({type(e).__name__}: {e})") from None
    return table


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray], *, sync: bool = True) -> None:
    """Store named 1-d numpy arrays as one Arrow row of ``large_list`` columns (fsynced unless
    ``sync=False``, as :func:`write_table`)."""
    write_table(path, arrays_table(arrays), sync=sync)


def arrays_table(arrays: Mapping[str, np.ndarray]) -> pa.Table:
    """The one-row table of ``large_list`` columns that :func:`write_arrays` stores (no copy of
    the arrays).

    Raises:
        ValueError: an array that is not 1-d."""
    cols = {}
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        if arr.ndim != 1:
            raise ValueError(f"array {name!r} must be 1-d, got shape {arr.shape}")
        offsets = pa.array(np.array([0, len(arr)], dtype=np.int64))
        cols[name] = pa.LargeListArray.from_arrays(offsets, pa.array(arr))
    return pa.table(cols)


def arrays_of_table(path: Path, table: pa.Table, expected: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """The named arrays of an array file's table (one row of ``large_list`` columns).

    Args:
        path: the file (for messages); ``expected``: ``{name: dtype}`` each array must have.

    Raises:
        IndexFormatError: missing column, wrong dtype or type, or malformed list (names the file).
    """
    out = {}
    for name, dtype in expected.items():
        if name not in table.column_names:
            raise IndexFormatError(f"{path}: missing array {name!r}")
        col = table.column(name)
        if col.num_chunks != 1 or len(col) != 1 or not (pa.types.is_large_list(col.type) or pa.types.is_list(col.type)):
            raise IndexFormatError(f"{path}: array {name!r} is malformed (type {col.type})")
        chunk = col.chunk(0)
        if chunk.null_count:
            raise IndexFormatError(f"{path}: array {name!r} is null")
        lo, hi = chunk.offsets[0].as_py(), chunk.offsets[1].as_py()
        if not (0 <= lo <= hi <= len(chunk.values)) or lo != 0 or hi != len(chunk.values):
            raise IndexFormatError(f"{path}: array {name!r} has corrupted list offsets")
        values = chunk.values
        try:
            arr = values.to_numpy(zero_copy_only=True) if values.null_count == 0 else None
        except (pa.ArrowException, ValueError, TypeError):
            arr = None
        if arr is None or arr.dtype != np.dtype(dtype):
            raise IndexFormatError(f"{path}: array {name!r} has dtype {values.type}, expected {np.dtype(dtype)}")
        out[name] = arr
    return out
