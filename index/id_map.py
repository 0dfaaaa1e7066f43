"""The id map of a living index: document id -> where its live row is.

An :class:`~retriever.index.updates.IndexUpdater` needs, for every add, upsert and delete, the
live row of each given ``_id`` (an add must refuse ids the index holds, an upsert and a delete
mark the old rows deleted). A Python ``dict`` of every id costs a string object and a dict slot
per document (about 100 bytes) and the first add of an updater built it in Python, one id at a
time. This map keeps the ids in the compiled token table the BM25 builder uses for terms
(:class:`~retriever.index.analyzer_kernels.TokenTable`: UTF-8 bytes, open addressing), filled
from the segments' Arrow id columns without making a Python string per id, with an int64 code
per entry (``-1``: no live row; an entry is never removed, a deleted id keeps its entry).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from .analyzer_kernels import TokenTable, arrow_utf8_arrays, utf8_arrays


def _utf8(ids: Sequence[str] | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes and offsets of ``ids``. A string Python cannot encode as UTF-8 (a lone
    surrogate) is encoded with ``surrogatepass``: bytes no stored id (valid UTF-8) can equal."""
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        return arrow_utf8_arrays(arr)
    try:
        return utf8_arrays(list(ids))
    except UnicodeError:
        parts = [i.encode("utf-8", "surrogatepass") for i in ids]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in parts], out=offsets[1:])
        data = np.frombuffer(b"".join(parts) or b"\0", dtype=np.uint8)
        return data, offsets


class IdMap:
    """Document id -> code (an int64 the caller defines; ``>= 0``) of every live document.

    Not thread-safe: one writer uses it.
    """

    def __init__(self) -> None:  # noqa: D107
        self._table = TokenTable()
        self._codes = np.empty(0, dtype=np.int64)  # per entry; -1: no live row
        self._n_live = 0

    def __len__(self) -> int:
        """Ids with a live row."""
        return self._n_live

    def _grow(self, n: int) -> None:
        if n > len(self._codes):
            grown = np.full(max(n, 2 * len(self._codes)), -1, dtype=np.int64)
            grown[:len(self._codes)] = self._codes
            self._codes = grown

    def load(self, ids: Sequence[str] | pa.Array, codes: np.ndarray) -> None:
        """Add ids none of which the map has ever held (a segment's live ids, when the map is
        built), with their codes.

        Raises:
            ValueError: an id repeats one of this call or one the map held (names it), or
                ``codes`` is not as long as ``ids``; the map must not be used after it.
        """
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(codes)} codes")
        lo = self._table.n
        data, offsets = _utf8(ids)
        self._table.add_distinct(data, offsets)
        self._grow(self._table.n)
        self._codes[lo:self._table.n] = codes
        self._n_live += len(codes)

    def _lookup(self, ids: Sequence[str] | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(entry of each id, -1 where none; its code, -1 where no live row)."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        e = self._table.find(*_utf8(ids))
        out = np.full(len(e), -1, dtype=np.int64)
        hit = e >= 0
        out[hit] = self._codes[e[hit]]
        return e, out

    def find(self, ids: Sequence[str] | pa.Array) -> np.ndarray:
        """i64[len(ids)]: the code of each id, -1 where it has no live row."""
        return self._lookup(ids)[1]

    def assign(self, ids: Sequence[str], codes: np.ndarray) -> None:
        """Set the codes of ``ids`` (distinct), live or not before.

        Raises:
            ValueError: ``codes`` is not as long as ``ids``, or holds a negative code.
        """
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(codes)} codes")
        if len(codes) == 0:
            return
        if bool((codes < 0).any()):
            raise ValueError("codes must be >= 0")
        data, offsets = _utf8(ids)
        e = self._table.find(data, offsets)
        new = np.flatnonzero(e < 0)
        if len(new):
            lo = self._table.n
            if len(new) == len(ids):
                self._table.add_distinct(data, offsets)
            else:  # the bytes of the new ids only
                starts, lens = offsets[new], offsets[new + 1] - offsets[new]
                sub_off = np.zeros(len(new) + 1, dtype=np.int64)
                np.cumsum(lens, out=sub_off[1:])
                pos = np.arange(int(sub_off[-1]), dtype=np.int64) + np.repeat(starts - sub_off[:-1], lens)
                self._table.add_distinct(data[pos] if len(pos) else np.zeros(1, np.uint8), sub_off)
            e[new] = np.arange(lo, self._table.n)
            self._grow(self._table.n)
        was = self._codes[e]
        self._n_live += int((was < 0).sum())
        self._codes[e] = codes

    def remove(self, ids: Sequence[str]) -> np.ndarray:
        """Remove the live rows of ``ids`` (distinct) from the map; returns their codes as
        :meth:`find` gave them (-1: had none)."""
        e, out = self._lookup(ids)
        live = np.flatnonzero(out >= 0)
        self._codes[e[live]] = -1
        self._n_live -= len(live)
        return out

    def memory_bytes(self) -> int:
        """Bytes held by the map's arrays."""
        t = self._table
        return int(t.slots.nbytes + t.off.nbytes + t.blob.nbytes + self._codes.nbytes)
