"""Build-time array kernels (numba) of the BM25 analyzer and postings builder.

The analyzer's Python definition (:mod:`retriever.index.analyzer`: ``str.casefold``, the possessive regex,
the token regex) is the reference; these kernels compute the same token streams over a whole
batch of UTF-8 encoded texts without creating a Python object per token:

1. *decode + fold*: UTF-8 → code points, each replaced by its ``str.casefold`` expansion (a table
   built from Python itself for the Basic Multilingual Plane; Python's casefold is per character,
   without context). A text containing a code point above U+FFFF is not handled: the kernel stops
   before it and the caller analyses that text in Python.
2. *possessive strip*: ``(?<=\\w)['’][sS]\\b`` removed, left to right, lookbehind on the unstripped
   text (as ``re.sub`` does).
3. *tokenise*: the token regex of :mod:`retriever.index.analyzer` written as a scanner: an ideograph /
   Hiragana character alone, or a maximal chain of non-ideographic word-character runs joined by
   ``.``, ``'``, ``’`` (followed by a word character) or ``,`` between two digits.
   ``\\w`` / ``\\d`` membership comes from a table built by running Python's own ``re`` over every
   BMP character, so the classes are Python's by construction.
4. *dedupe*: each distinct token gets an entry number (first-occurrence order) in a persistent
   open-addressing hash table (exact key for tokens of <= 7 bytes, else FNV-1a 64 of the UTF-8
   bytes plus a byte comparison), so the caller stems and assigns each distinct token once.

ASCII texts skip step 1's decoding (folded byte by byte). Every kernel runs without the GIL.
Then :func:`count_terms` turns entries into per-document (term id, tf) pairs and document
lengths, and :func:`csr_by_term` is the stable counting sort that turns a shard's pairs into CSR
postings (doc ids ascending within each term); :func:`csr_by_term_compact` the same for a living
index's segment, listing only the terms that occur, in time independent of the vocabulary. All
functions are pure functions of arrays (:func:`csr_by_term_compact` also takes work arrays it
leaves as it found them).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numba as nb
import numpy as np

WORD = np.uint8(1)
DIGIT = np.uint8(2)
IDEO = np.uint8(4)

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@lru_cache(maxsize=1)
def char_tables(ideo_class: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-BMP-code-point tables, computed from Python's own ``re`` and ``str.casefold``.

    Args:
        ideo_class: the body of the regex character class of single-character tokens
            (``retriever.index.analyzer._IDEO``).

    Returns:
        ``flags`` u8[65536] (bit 1: ``\\w``, bit 2: ``\\d``, bit 4: in ``ideo_class``),
        ``fold_n`` u8[65536] (length of ``chr(c).casefold()``, 1..3) and ``fold_cp``
        u32[65536 * 3] (its code points; all of them are in the BMP).
    """
    chars = "".join(map(chr, range(0x10000)))
    flags = np.zeros(0x10000, dtype=np.uint8)
    for pat, bit in ((r"\w", WORD), (r"\d", DIGIT), (f"[{ideo_class}]", IDEO)):
        idx = np.fromiter((m.start() for m in re.finditer(pat, chars)), dtype=np.int64)
        flags[idx] |= bit
    fold_n = np.ones(0x10000, dtype=np.uint8)
    fold_cp = np.zeros(0x10000 * 3, dtype=np.uint32)
    fold_cp[0::3] = np.arange(0x10000, dtype=np.uint32)
    for c in range(0x10000):
        f = chars[c].casefold()
        if f != chars[c]:
            if len(f) > 3 or any(ord(x) > 0xFFFF for x in f):  # never true (checked for Python 3.11)
                raise ValueError(f"casefold of U+{c:04X} is {f!r}: outside the table's layout")
            fold_n[c] = len(f)
            for j, x in enumerate(f):
                fold_cp[3 * c + j] = ord(x)
    return flags, fold_n, fold_cp


@nb.njit(cache=True, inline="always")
def _put_utf8(buf, n, cp):
    if cp < 0x80:
        buf[n] = cp
        return n + 1
    if cp < 0x800:
        buf[n] = 0xC0 | (cp >> 6)
        buf[n + 1] = 0x80 | (cp & 0x3F)
        return n + 2
    buf[n] = 0xE0 | (cp >> 12)
    buf[n + 1] = 0x80 | ((cp >> 6) & 0x3F)
    buf[n + 2] = 0x80 | (cp & 0x3F)
    return n + 3


_KEY_LONG = np.int64(-72057594037927936)  # 0xFF << 56: keys of tokens longer than 7 bytes
_KEY_SHORT = np.int64(-9223372036854775808)  # 0x80 << 56: keys of tokens of at most 7 bytes
_MIX = np.uint64(0x9E3779B97F4A7C15)
_U29 = np.uint64(29)
_U32 = np.uint64(32)


@nb.njit(cache=True, inline="always")
def _key(buf, start, m):
    """Slot key of the token buf[start:start+m] (m >= 0), never 0: the bytes themselves and
    0x80 | length in the top byte when m <= 7 (exact), else 0xFF and 56 bits of its FNV-1a hash
    (the bytes are compared too)."""
    if m <= 7:
        k = _KEY_SHORT | (np.int64(m) << 56)  # no signed overflow (undefined in LLVM)
        for j in range(m):
            k |= np.int64(buf[start + j]) << (8 * j)
        return k
    h = _FNV_OFFSET
    for j in range(m):
        h = (h ^ np.uint64(buf[start + j])) * _FNV_PRIME
    return np.int64(h >> np.uint64(8)) | _KEY_LONG


@nb.njit(cache=True, inline="always")
def _slot_of(key, mask):
    x = np.uint64(key) * _MIX  # unsigned: wrapping arithmetic is defined
    x ^= x >> _U29
    x *= _MIX
    x ^= x >> _U32
    return np.int64(x & np.uint64(mask))


@nb.njit(cache=True, inline="always")
def _fits(slots, e_off, blob, n_e, new_entries, new_bytes):
    """True when ``new_entries`` more entries of ``new_bytes`` more bytes fit without growing (the
    conditions of :func:`_reserve`, checked inline so the common case makes no call)."""
    return (n_e + new_entries + 2 <= e_off.shape[0] and e_off[n_e] + new_bytes <= blob.shape[0]
            and 2 * (n_e + new_entries) <= (slots.shape[0] >> 1))


@nb.njit(cache=True, nogil=True)
def _reserve(slots, e_off, blob, n_e, new_entries, new_bytes):
    """Grow the table's arrays (doubling, rehashing ``slots``) so that ``new_entries`` more entries
    of ``new_bytes`` more bytes (separators included) fit with the load factor <= 1/2."""
    if n_e + new_entries + 2 > e_off.shape[0]:
        no = np.zeros(max(2 * e_off.shape[0], n_e + new_entries + 2), dtype=np.int64)
        no[:n_e + 1] = e_off[:n_e + 1]
        e_off = no
    o = e_off[n_e]
    if o + new_bytes > blob.shape[0]:
        nb_ = np.empty(max(2 * blob.shape[0], o + new_bytes), dtype=np.uint8)
        nb_[:o] = blob[:o]
        blob = nb_
    cap = slots.shape[0] >> 1
    if 2 * (n_e + new_entries) > cap:
        while 2 * (n_e + new_entries) > cap:
            cap *= 2
        old = slots
        slots = np.zeros(2 * cap, dtype=np.int64)
        mask = cap - 1
        for q in range(old.shape[0] >> 1):
            k3 = old[2 * q]
            if k3 != 0:
                sl = _slot_of(k3, mask)
                while slots[2 * sl] != 0:
                    sl = (sl + 1) & mask
                slots[2 * sl] = k3
                slots[2 * sl + 1] = old[2 * q + 1]
    return slots, e_off, blob


@nb.njit(cache=True, inline="always")
def _probe(buf, s, m, key, slot, mask, slots, e_off, blob):
    """Linear probing from ``slot`` for the token ``buf[s:s+m]`` of slot key ``key``: (its slot,
    its entry), or (the first empty slot, -1) when the table does not hold it."""
    while True:
        k2 = slots[2 * slot]
        if k2 == 0:
            return slot, -1
        if k2 == key:
            e = slots[2 * slot + 1]
            if m <= 7:
                return slot, e
            o = e_off[e]
            if e_off[e + 1] - 1 - o == m:
                same = True
                for j in range(m):
                    if blob[o + j] != buf[s + j]:
                        same = False
                        break
                if same:
                    return slot, e
        slot = (slot + 1) & mask


@nb.njit(cache=True, nogil=True)
def _insert_distinct(data, offsets, slots, e_off, blob, n_e):
    """Add every text of ``data`` / ``offsets`` as a new entry (numbered from ``n_e`` in text
    order), the slots filled in the order of their home slots (a counting sort by the top bits
    of the home slot): the inserts walk the slot array once instead of jumping through it at
    random. Capacity must have been reserved. Returns -1, or the index of a text equal to an
    entry of the table or to an earlier text (the later copy; the table is unusable then)."""
    n = offsets.shape[0] - 1
    cap = slots.shape[0] >> 1
    mask = cap - 1
    home = np.empty(n, dtype=np.int64)
    keys = np.empty(n, dtype=np.int64)
    o = e_off[n_e]
    for i in range(n):
        s = offsets[i]
        m = offsets[i + 1] - s
        keys[i] = _key(data, s, m)
        home[i] = _slot_of(keys[i], mask)
        for j in range(m):
            blob[o + j] = data[s + j]
        blob[o + m] = 0x0A
        o += m + 1
        e_off[n_e + i + 1] = o
    shift = 0
    while (cap >> shift) > 65536:
        shift += 1
    counts = np.zeros((cap >> shift) + 1, dtype=np.int64)
    for i in range(n):
        counts[(home[i] >> shift) + 1] += 1
    for b in range(1, counts.shape[0]):
        counts[b] += counts[b - 1]
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        b = home[i] >> shift
        order[counts[b]] = i
        counts[b] += 1
    for r in range(n):
        i = order[r]
        s = offsets[i]
        slot, e = _probe(data, s, offsets[i + 1] - s, keys[i], home[i], mask, slots, e_off, blob)
        if e >= 0:
            return i
        slots[2 * slot] = keys[i]
        slots[2 * slot + 1] = n_e + i
    return -1


@nb.njit(cache=True, nogil=True)
def _find_entries(data, offsets, slots, e_off, blob):
    """i64[n]: the entry of each text of ``data`` / ``offsets`` (verbatim), -1 where absent (the
    table is not changed)."""
    n = offsets.shape[0] - 1
    out = np.full(n, -1, dtype=np.int64)
    mask = (slots.shape[0] >> 1) - 1
    for i in range(n):
        s = offsets[i]
        m = offsets[i + 1] - s
        key = _key(data, s, m)
        out[i] = _probe(data, s, m, key, _slot_of(key, mask), mask, slots, e_off, blob)[1]
    return out


@nb.njit(cache=True, inline="always")
def _lookup(buf, s, m, slots, e_off, blob, n_e):
    """Entry of the token ``buf[s:s+m]``; adds it as entry ``n_e`` when absent (the caller checks
    ``result == n_e``). Capacity must have been reserved (:func:`_reserve`)."""
    key = _key(buf, s, m)
    mask = (slots.shape[0] >> 1) - 1
    slot, e = _probe(buf, s, m, key, _slot_of(key, mask), mask, slots, e_off, blob)
    if e >= 0:
        return e
    o = e_off[n_e]
    for j in range(m):
        blob[o + j] = buf[s + j]
    blob[o + m] = 0x0A
    e_off[n_e + 1] = o + m + 1
    slots[2 * slot] = key
    slots[2 * slot + 1] = n_e
    return n_e


@nb.njit(cache=True, inline="always")
def _strip_possessive(buf, n, flags):
    r"""Remove ``(?<=\w)['’][sS]\b`` from ``buf[:n]`` in place, left to right, the lookbehind on the
    unstripped text (as ``re.sub`` does); returns the new length."""
    w = 0
    i = 0
    while i < n:
        c = buf[i]
        if ((c == 0x27 or c == 0x2019) and i > 0 and (flags[buf[i - 1]] & 1) != 0 and i + 1 < n
                and (buf[i + 1] == 0x73 or buf[i + 1] == 0x53)
                and (i + 2 >= n or (flags[buf[i + 2]] & 1) == 0)):
            i += 2
            continue
        buf[w] = c
        w += 1
        i += 1
    return w


@nb.njit(cache=True, inline="always")
def _next_token(buf, n, i, flags):
    """The next token of ``buf[:n]`` at or after ``i``: ``(start, end)``, or ``(-1, n)`` when there
    is none. A token is an ideograph / Hiragana character alone, or a maximal chain of
    non-ideographic word-character runs joined by ``.``, ``'``, ``’`` (followed by a word
    character) or ``,`` between two digits."""
    while i < n:
        f = flags[buf[i]]
        if (f & 4) != 0:
            return i, i + 1
        if (f & 1) != 0:
            s = i
            i += 1
            while True:
                while i < n and (flags[buf[i]] & 5) == 1:
                    i += 1
                if i + 1 < n and (flags[buf[i + 1]] & 5) == 1:
                    c = buf[i]
                    if c == 0x2E or c == 0x27 or c == 0x2019:
                        i += 2
                        continue
                    if c == 0x2C and (flags[buf[i - 1]] & 2) != 0 and (flags[buf[i + 1]] & 2) != 0:
                        i += 2
                        continue
                break
            return s, i
        i += 1
    return -1, n


@nb.njit(cache=True, nogil=True)
def _fold_ascii(data, i0, n, lower, lb):
    """``lb[:n]`` = ASCII fold of ``data[i0:i0+n]``; returns (all ASCII, has an apostrophe)."""
    apos = False
    for j in range(n):
        b = data[i0 + j]
        if b >= 0x80:
            return False, apos
        lb[j] = lower[b]
        if b == 0x27:
            apos = True
    return True, apos


@nb.njit(cache=True, nogil=True)
def _tokens_cps(cps, n, tokb, flags, slots, e_off, blob, n_e, tok_out, n_tok):
    """Tokens of the code points ``cps[:n]`` (UTF-8 encoded into ``tokb``) → entries appended to
    ``tok_out`` (capacity reserved); returns (n_e, n_tok)."""
    i = 0
    while True:
        s, i = _next_token(cps, n, i, flags)
        if s < 0:
            break
        m = 0
        for j in range(s, i):
            m = _put_utf8(tokb, m, cps[j])
        e = _lookup(tokb, 0, m, slots, e_off, blob, n_e)
        if e == n_e:
            n_e += 1
        tok_out[n_tok] = e
        n_tok += 1
    return n_e, n_tok


@nb.njit(cache=True, nogil=True)
def _scan(data, offsets, flags, fold_n, fold_cp, lower, lowercase, verbatim, stop_on_astral,
          slots, e_off, blob, n_e, tok_out, doc_ntok):
    """See :func:`scan_tokens`; returns (docs done, tokens written, slots, e_off, blob, n_e)."""
    n_docs = offsets.shape[0] - 1
    cps = np.empty(1024, dtype=np.int64)
    lb = np.empty(1024, dtype=np.uint8)
    tokb = np.empty(3 * 1024, dtype=np.uint8)
    n_tok = 0
    for d in range(n_docs):
        i0 = offsets[d]
        end = offsets[d + 1]
        n = end - i0
        first_tok = n_tok
        if verbatim:  # the text is one token already
            if not _fits(slots, e_off, blob, n_e, 1, n + 1):
                slots, e_off, blob = _reserve(slots, e_off, blob, n_e, 1, n + 1)
            e = _lookup(data, i0, n, slots, e_off, blob, n_e)
            if e == n_e:
                n_e += 1
            tok_out[n_tok] = e
            n_tok += 1
            doc_ntok[d] = 1
            continue
        if n > lb.shape[0]:
            lb = np.empty(2 * n, dtype=np.uint8)
        # ASCII fast path: fold byte by byte into lb, tokenise the bytes in place
        ascii, apos = _fold_ascii(data, i0, n, lower, lb)
        if ascii:
            if apos:
                n = _strip_possessive(lb, n, flags)
            # <= (n + 1) // 2 tokens, each followed by a separator in the blob
            if not _fits(slots, e_off, blob, n_e, (n + 1) // 2, n + (n + 1) // 2 + 1):
                slots, e_off, blob = _reserve(slots, e_off, blob, n_e, (n + 1) // 2, n + (n + 1) // 2 + 1)
            # tokens -> entries; the loop is written out here (as a separate function called per
            # text, with _reserve called per text too, the scan of 200k synthetic texts took
            # about 1.5 s instead of 0.8 s)
            i = 0
            while True:
                s, i = _next_token(lb, n, i, flags)
                if s < 0:
                    break
                e = _lookup(lb, s, i - s, slots, e_off, blob, n_e)
                if e == n_e:
                    n_e += 1
                tok_out[n_tok] = e
                n_tok += 1
            doc_ntok[d] = n_tok - first_tok
            continue
        # general path. 1. decode + fold
        if 3 * n + 3 > cps.shape[0]:
            cps = np.empty(2 * (3 * n + 3), dtype=np.int64)
            tokb = np.empty(3 * cps.shape[0], dtype=np.uint8)
        i = i0
        n = 0
        apos = False
        bad = False
        while i < end:
            b = np.int64(data[i])
            if b < 0x80:
                cp = b
                i += 1
            elif b < 0xE0:
                cp = ((b & 0x1F) << 6) | (np.int64(data[i + 1]) & 0x3F)
                i += 2
            elif b < 0xF0:
                cp = ((b & 0x0F) << 12) | ((np.int64(data[i + 1]) & 0x3F) << 6) | (np.int64(data[i + 2]) & 0x3F)
                i += 3
            else:  # above U+FFFF: not handled here
                bad = True
                break
            if lowercase:
                k = fold_n[cp]
                for j in range(k):
                    c2 = np.int64(fold_cp[3 * cp + j])
                    cps[n] = c2
                    n += 1
                    if c2 == 0x27 or c2 == 0x2019:
                        apos = True
            else:
                cps[n] = cp
                n += 1
                if cp == 0x27 or cp == 0x2019:
                    apos = True
        if bad:
            if stop_on_astral:
                return d, n_tok, slots, e_off, blob, n_e
            doc_ntok[d] = -1
            continue
        # 2. possessive strip
        if apos:
            n = _strip_possessive(cps, n, flags)
        # 3. tokenise; 4. token bytes -> entry (<= n tokens of <= 3 bytes per code point)
        if not _fits(slots, e_off, blob, n_e, n, 4 * n + 1):
            slots, e_off, blob = _reserve(slots, e_off, blob, n_e, n, 4 * n + 1)
        n_e, n_tok = _tokens_cps(cps, n, tokb, flags, slots, e_off, blob, n_e, tok_out, n_tok)
        doc_ntok[d] = n_tok - first_tok
    return n_docs, n_tok, slots, e_off, blob, n_e


@nb.njit(cache=True, nogil=True)
def _char_lengths(e_off, blob, lo, hi):
    """Code points of entries lo..hi-1 (UTF-8 bytes that are not continuation bytes)."""
    out = np.zeros(hi - lo, dtype=np.int64)
    for e in range(lo, hi):
        c = 0
        for p in range(e_off[e], e_off[e + 1] - 1):
            if (blob[p] & 0xC0) != 0x80:
                c += 1
        out[e - lo] = c
    return out


class TokenTable:
    """A token → entry hash table kept in numpy arrays, so the kernels stay pure functions.

    Entries are numbered 0, 1, ... in the order they were added. ``slots`` i64[2 * cap] (cap a
    power of two, load <= 1/2, linear probing): pairs ``(key, entry)``, key 0 = empty (see
    ``_key``); ``off`` i64 and ``blob`` u8 (entry e's UTF-8 bytes are ``blob[off[e]:off[e+1]-1]``,
    each followed by ``\n``); ``value`` i64[>= n]: the caller's value of each entry (e.g. a term
    id), set with :meth:`set_values`.
    """

    def __init__(self) -> None:
        self.slots = np.zeros(2 * 1024, dtype=np.int64)
        self.off = np.zeros(1025, dtype=np.int64)
        self.blob = np.empty(8192, dtype=np.uint8)
        self.value = np.empty(1024, dtype=np.int64)
        self.n = 0

    def set_values(self, lo: int, values: np.ndarray) -> None:
        """Set the values of entries ``lo .. lo + len(values) - 1``.

        Raises:
            ValueError: entries that do not exist.
        """
        values = np.asarray(values, dtype=np.int64)
        hi = lo + len(values)
        if lo < 0 or hi > self.n:
            raise ValueError(f"entries {lo}..{hi - 1} do not exist (table has {self.n})")
        if hi > len(self.value):
            grown = np.empty(max(2 * len(self.value), hi), dtype=np.int64)
            grown[:lo] = self.value[:lo]
            self.value = grown
        self.value[lo:hi] = values

    def reserve(self, entries: int, n_bytes: int) -> None:
        """Make room for ``entries`` more entries of ``n_bytes`` more UTF-8 bytes in all (their
        separators not counted) at once, instead of doubling and rehashing while they arrive."""
        if entries < 0 or n_bytes < 0:
            raise ValueError(f"cannot reserve {entries} entries of {n_bytes} bytes")
        self.slots, self.off, self.blob = _reserve(self.slots, self.off, self.blob, np.int64(self.n),
                                                   np.int64(entries), np.int64(n_bytes + entries))

    def add_distinct(self, data: np.ndarray, offsets: np.ndarray) -> None:
        """Add texts known to be distinct, each verbatim as one new entry (numbered from ``n`` in
        order): what :func:`scan_tokens` with ``verbatim=True`` does for them, about four times
        faster on a large table (the slots are filled in the order of their home slots). Runs
        without the GIL.

        Args:
            data, offsets: as for :func:`scan_tokens`.

        Raises:
            ValueError: ``offsets`` out of order or outside ``data``; a text repeats an earlier
                one or an entry of the table (named by its index; the table must not be used
                after this error).
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) < 1 or offsets[0] < 0 or offsets[-1] > len(data) or bool((np.diff(offsets) < 0).any()):
            raise ValueError(f"offsets must be non-decreasing within [0, {len(data)}]")
        n = len(offsets) - 1
        if self.n + n >= 2**31:
            raise ValueError(f"token table would have {self.n + n} entries, more than int32 entry ids allow")
        self.reserve(n, int(offsets[-1] - offsets[0]))
        bad = _insert_distinct(data, offsets, self.slots, self.off, self.blob, np.int64(self.n))
        if bad >= 0:
            t = bytes(data[offsets[bad]:offsets[bad + 1]]).decode("utf-8", "replace")
            raise ValueError(f"text {bad} ({t[:64]!r}) repeats an earlier text or an entry of the table")
        self.n += n

    def find(self, data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """i64[n]: the entry of each text (verbatim, as :meth:`add_distinct` adds them), -1 where
        the table has none; the table is not changed. Runs without the GIL.

        Raises:
            ValueError: ``offsets`` out of order or outside ``data``.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) < 1 or offsets[0] < 0 or offsets[-1] > len(data) or bool((np.diff(offsets) < 0).any()):
            raise ValueError(f"offsets must be non-decreasing within [0, {len(data)}]")
        return _find_entries(data, offsets, self.slots, self.off, self.blob)

    def copy(self) -> "TokenTable":
        """An independent copy (same entries and values)."""
        out = TokenTable.__new__(TokenTable)
        out.slots, out.off, out.blob, out.value = self.slots.copy(), self.off.copy(), self.blob.copy(), self.value.copy()
        out.n = self.n
        return out

    def tokens(self, lo: int, hi: int) -> list[str]:
        """Entries ``lo..hi-1`` as strings."""
        if hi <= lo:
            return []
        return self.blob[self.off[lo]:self.off[hi]].tobytes().decode("utf-8").split("\n")[:-1]

    def char_lengths(self, lo: int, hi: int) -> np.ndarray:
        """i64[hi-lo]: length in code points of entries ``lo..hi-1`` (``len`` of :meth:`tokens`)."""
        return _char_lengths(self.off, self.blob, np.int64(lo), np.int64(max(hi, lo)))


def utf8_arrays(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes and byte offsets of ``texts`` (one Arrow string buffer, no copy per text), the
    input of :func:`scan_tokens`, :func:`tokenize_utf8` and ``_kernels.bm25_query_terms``.

    Returns:
        ``(data u8[total] (u8[1] when every text is empty), offsets i64[n+1])``: text i is
        ``data[offsets[i]:offsets[i+1]]``.

    Raises:
        UnicodeError: a text holds a lone surrogate (not encodable as UTF-8).
    """
    import pyarrow as pa

    try:
        arr = pa.array(texts, type=pa.large_string())
    except pa.ArrowException as e:  # lone surrogates
        raise UnicodeError(str(e)) from None
    bufs = arr.buffers()
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
    return data, np.frombuffer(bufs[1], dtype=np.int64, count=len(texts) + 1)


def arrow_utf8_arrays(arr: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`utf8_arrays` of an Arrow string array (its own buffers, no copy for a large_string
    array; another string type is cast first).

    Raises:
        ValueError: the array holds nulls.
    """
    import pyarrow as pa

    if arr.null_count:
        raise ValueError(f"{arr.null_count} null strings")
    if arr.type != pa.large_string():
        arr = arr.cast(pa.large_string())
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=arr.offset + len(arr) + 1)[arr.offset:]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and len(bufs[2]) else np.zeros(1, np.uint8)
    return data, offsets


@lru_cache(maxsize=4)
def _ascii_fold(ideo_class: str, lowercase: bool) -> np.ndarray:
    """u8[128]: each ASCII byte's ``str.casefold`` (itself when not ``lowercase``)."""
    _, fold_n, fold_cp = char_tables(ideo_class)
    if not lowercase:
        return np.arange(128, dtype=np.uint8)
    if not (fold_n[:128] == 1).all() or (fold_cp[0:384:3] >= 128).any():  # never true
        raise ValueError("casefold of an ASCII character is not one ASCII character")
    return fold_cp[0:384:3].astype(np.uint8)


def scan_tokens(data: np.ndarray, offsets: np.ndarray, table: TokenTable, *, lowercase: bool, ideo_class: str,
                verbatim: bool = False, stop_on_astral: bool = False) -> tuple[int, np.ndarray, np.ndarray, int]:
    """Tokenise UTF-8 texts and look every token up in ``table``, adding the new ones.

    Runs without the GIL (numba ``nogil``), so another thread can run Python meanwhile; ``table``
    must not be used by another thread during the call.

    Args:
        data: u8[total] UTF-8 bytes of all texts (valid UTF-8, e.g. an Arrow string buffer).
        offsets: i64[n+1] byte offsets; text i is ``data[offsets[i]:offsets[i+1]]``.
        table: token table; grows in place (its arrays may be replaced).
        lowercase: apply ``str.casefold``.
        ideo_class: regex class body of single-character tokens (``retriever.index.analyzer._IDEO``).
        verbatim: each text is one token as it is (no folding or splitting).
        stop_on_astral: stop before the first text with a code point above U+FFFF (otherwise
            such a text is skipped and its count is -1).

    Returns:
        ``(done, entries i32[m], counts i64[done], first_new)``: texts ``0..done-1`` were
        scanned; ``entries`` holds, per token occurrence in order, the table entry of the token;
        the entries this call added are ``first_new..table.n-1``, in first-occurrence order;
        ``counts`` the number of tokens per text.

    Raises:
        ValueError: ``offsets`` is not non-decreasing within ``data``.
    """
    if len(offsets) < 1 or offsets[0] < 0 or offsets[-1] > len(data) or bool((np.diff(offsets) < 0).any()):
        raise ValueError(f"offsets must be non-decreasing within [0, {len(data)}]")
    flags, fold_n, fold_cp = char_tables(ideo_class)
    n = len(offsets) - 1
    # a token takes >= 1 byte and two word tokens are >= 1 byte apart; an ideograph is 3 bytes
    bound = (int(offsets[n] - offsets[0]) + 1) // 2 + n + 1
    tok_out = np.empty(bound, dtype=np.int32)
    counts = np.zeros(n, dtype=np.int64)
    first_new = table.n
    done, n_tok, table.slots, table.off, table.blob, n_e = _scan(
        data, offsets.astype(np.int64, copy=False), flags, fold_n, fold_cp, _ascii_fold(ideo_class, bool(lowercase)),
        bool(lowercase), bool(verbatim), bool(stop_on_astral), table.slots, table.off, table.blob,
        np.int64(table.n), tok_out, counts)
    table.n = int(n_e)
    if table.n >= 2**31:
        raise ValueError(f"token table has {table.n} entries, more than int32 entry ids allow")
    return int(done), tok_out[:n_tok], counts[:done], first_new


def tokenize_utf8(data: np.ndarray, offsets: np.ndarray, *, lowercase: bool,
                  ideo_class: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Tokenise a batch of UTF-8 texts (those it handles; see the module docstring).

    Args:
        data: u8[total] UTF-8 bytes of all texts (valid UTF-8, e.g. an Arrow string buffer).
        offsets: i64[n+1] byte offsets; text i is ``data[offsets[i]:offsets[i+1]]``.
        lowercase: apply ``str.casefold``.
        ideo_class: regex class body of single-character tokens.

    Returns:
        ``(local_ids i32[m], counts i64[n], tokens)``: ``tokens[local_ids[...]]`` is the token
        stream of the handled texts in order, ``counts`` the number of tokens per text (-1 for a
        text not handled: it has a code point above U+FFFF), ``tokens`` the distinct tokens in
        first-occurrence order.

    Raises:
        ValueError: ``offsets`` is not non-decreasing from 0 or does not fit ``data``.
    """
    table = TokenTable()
    _, entries, counts, _ = scan_tokens(data, offsets, table, lowercase=lowercase, ideo_class=ideo_class)
    return entries, counts, table.tokens(0, table.n)


@nb.njit(cache=True, nogil=True)
def _count_terms(local_ids, counts, lmap, last, pos, stamp, first_doc, identity):
    # last[g]: the stamp of the last document (stamp + d) that held term g; every earlier call's
    # stamps are below this call's, so the arrays need no clearing between calls
    n_docs = counts.shape[0]
    out_doc = np.empty(local_ids.shape[0], dtype=np.uint32)
    out_tid = np.empty(local_ids.shape[0], dtype=np.uint32)
    out_tf = np.empty(local_ids.shape[0], dtype=np.uint32)
    lens = np.zeros(n_docs, dtype=np.uint32)
    k = 0
    p = 0
    for d in range(n_docs):
        s = stamp + d
        for _ in range(counts[d]):
            g = local_ids[p] if identity else lmap[local_ids[p]]
            p += 1
            if g < 0:
                continue
            lens[d] += 1
            if last[g] != s:
                last[g] = s
                pos[g] = k
                out_doc[k] = first_doc + d
                out_tid[k] = g
                out_tf[k] = 1
                k += 1
            else:
                out_tf[pos[g]] += 1
    return out_doc[:k], out_tid[:k], out_tf[:k], lens


class CountScratch:
    """Work arrays of :func:`count_terms`, kept between its calls so that a call costs
    O(tokens of the batch), not O(vocabulary): per term id, the stamp of the last document that
    held it (i64, -1: none yet) and that pair's output position (i64). Each call takes the next
    block of stamps, so nothing is cleared between calls. Grows with the vocabulary.

    Not thread-safe: one call at a time (the postings builder counts its batches in order on one
    worker thread).
    """

    def __init__(self) -> None:  # noqa: D107
        self.last = np.full(0, -1, dtype=np.int64)
        self.pos = np.zeros(0, dtype=np.int64)
        self.stamp = 0

    def take(self, n_terms: int, n_docs: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(last, pos, first stamp)`` for a call over ``n_docs`` documents and term ids below
        ``n_terms`` (the arrays grown when needed: new slots hold no stamp)."""
        if len(self.last) < n_terms:
            size = max(int(n_terms), 2 * len(self.last))
            last = np.full(size, -1, dtype=np.int64)
            last[:len(self.last)] = self.last
            self.last, self.pos = last, np.zeros(size, dtype=np.int64)
        stamp = self.stamp
        self.stamp += int(n_docs)
        return self.last, self.pos, stamp


def count_terms(local_ids: np.ndarray, counts: np.ndarray, lmap: np.ndarray | None, n_terms: int,
                first_doc: int, scratch: CountScratch | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-document term frequencies of a tokenised batch.

    Args:
        local_ids: int[m] token occurrences (local ids), texts one after another.
        counts: i64[n] tokens per text (sum = m).
        lmap: i64[n_local] term id of each local id (-1: not indexed, e.g. a stop word);
            every id must be < ``n_terms``. ``None``: ``local_ids`` are term ids already.
        n_terms: vocabulary size.
        first_doc: document number of the batch's first text.
        scratch: work arrays kept between calls (:class:`CountScratch`); ``None``: arrays of
            ``n_terms`` made for this call (O(vocabulary) per call).

    Returns:
        ``(doc u32[nnz], term u32[nnz], tf u32[nnz], doc_len u32[n])``; pairs grouped by
        document in ascending order (terms in first-occurrence order within a document).

    Raises:
        ValueError: ``counts`` does not sum to ``len(local_ids)`` or a term id is out of range.
    """
    if int(counts.sum()) != len(local_ids):
        raise ValueError(f"counts sum to {int(counts.sum())}, expected len(local_ids) = {len(local_ids)}")
    identity = lmap is None
    ids = local_ids if identity else lmap
    if len(ids) and (int(ids.max()) >= n_terms or int(ids.min()) < -1):
        raise ValueError(f"term ids outside [-1, {n_terms}): {int(ids.min())}..{int(ids.max())}")
    lmap = np.zeros(0, dtype=np.int64) if identity else lmap.astype(np.int64, copy=False)
    last, pos, stamp = (scratch if scratch is not None else CountScratch()).take(n_terms, len(counts))
    return _count_terms(local_ids, counts.astype(np.int64, copy=False), lmap, last, pos, np.int64(stamp),
                        np.int64(first_doc), identity)


@nb.njit(cache=True, nogil=True)
def _scatter(doc, tid, tf, offsets, out_doc, out_tf):
    cur = offsets[:-1].astype(np.int64)
    for i in range(doc.shape[0]):
        if i > 0 and doc[i] < doc[i - 1]:
            return False
    for i in range(doc.shape[0]):
        t = tid[i]
        p = cur[t]
        cur[t] = p + 1
        out_doc[p] = doc[i]
        out_tf[p] = tf[i]
    return True


def csr_by_term(doc: np.ndarray, tid: np.ndarray, tf: np.ndarray, n_terms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable counting sort of (doc, term, tf) triples by term: CSR postings.

    Equal to ``order = np.lexsort((doc, tid))`` when ``doc`` is non-decreasing (it is: batches
    are appended in document order), in O(nnz + n_terms).

    Returns:
        ``offsets`` u64[n_terms+1], ``doc_ids`` u32[nnz], ``tfs`` u32[nnz].

    Raises:
        ValueError: the arrays differ in length, a term id is >= ``n_terms``, or ``doc``
            decreases.
    """
    if not (len(doc) == len(tid) == len(tf)):
        raise ValueError(f"doc, tid, tf lengths differ: {len(doc)}, {len(tid)}, {len(tf)}")
    if len(doc) and int(tid.max()) >= n_terms:
        raise ValueError(f"term id {int(tid.max())} out of range (n_terms = {n_terms})")
    offsets = np.zeros(n_terms + 1, dtype=np.uint64)
    np.cumsum(np.bincount(tid, minlength=n_terms), out=offsets[1:])
    out_doc = np.empty(len(doc), dtype=np.uint32)
    out_tf = np.empty(len(doc), dtype=np.uint32)
    if not _scatter(doc, tid, tf, offsets, out_doc, out_tf):
        raise ValueError("documents not in ascending order")
    return offsets, out_doc, out_tf


class CsrScratch:
    """Work arrays of :func:`csr_by_term_compact`, kept between its calls so that a call costs
    O(nnz + T'), not O(vocabulary): a count per term id and a bitset of the term ids seen, both
    all zero between calls (a call clears exactly what it set). Grows with the vocabulary.

    Not thread-safe: one call at a time (the postings builder runs its flushes on its one worker
    thread).
    """

    def __init__(self) -> None:  # noqa: D107
        self.count = np.zeros(0, dtype=np.int64)
        self.bits = np.zeros(0, dtype=np.uint64)

    def ensure(self, n_terms: int) -> None:
        """Room for term ids below ``n_terms`` (new zero arrays when larger: nothing to carry)."""
        if len(self.count) < n_terms:
            size = max(int(n_terms), 2 * len(self.count))
            self.count = np.zeros(size, dtype=np.int64)
            self.bits = np.zeros((size + 63) // 64, dtype=np.uint64)


@nb.njit(cache=True, nogil=True)
def _csr_compact(doc, tid, tf, count, bits, out_doc, out_tf, terms, offsets):
    n = doc.shape[0]
    for i in range(1, n):  # checked before the scratch is touched
        if doc[i] < doc[i - 1]:
            return -1
    one = np.uint64(1)
    for i in range(n):  # postings per term; the terms seen marked in the bitset
        t = tid[i]
        if count[t] == 0:
            bits[t >> 6] |= one << np.uint64(t & 63)
        count[t] += 1
    k = 0
    for w in range(bits.shape[0]):  # the terms seen, ascending (bitset cleared on the way)
        word = bits[w]
        if word == 0:
            continue
        bits[w] = 0
        base = w * 64
        while word != 0:
            if (word & np.uint64(0xFF)) == 0:
                word >>= np.uint64(8)
                base += 8
                continue
            if word & one:
                terms[k] = base
                k += 1
            word >>= one
            base += 1
    pos = 0
    for j in range(k):  # list starts; the counts become write cursors
        t = terms[j]
        c = count[t]
        offsets[j] = pos
        count[t] = pos
        pos += c
    offsets[k] = pos
    for i in range(n):  # stable scatter: doc ids stay ascending within a list
        t = tid[i]
        p = count[t]
        count[t] = p + 1
        out_doc[p] = doc[i]
        out_tf[p] = tf[i]
    for j in range(k):
        count[terms[j]] = 0
    return k


def csr_by_term_compact(doc: np.ndarray, tid: np.ndarray, tf: np.ndarray, n_terms: int, scratch: CsrScratch
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`csr_by_term` in the compact form of a living index's segment: only the terms that
    occur are listed. Time O(nnz + T' + n_terms / 64) with ``scratch`` reused across calls (the
    dense form's counting sort and its compaction touch O(n_terms) memory several times: at a 1M
    vocabulary and a 10,000-document segment ~30 ms against ~7 ms).

    Returns:
        ``terms`` u32[T'] (ascending: the term ids that occur), ``offsets`` u64[T'+1] (list i is
        the list of ``terms[i]``), ``doc_ids`` u32[nnz], ``tfs`` u32[nnz] (as :func:`csr_by_term`).

    Raises:
        ValueError: the arrays differ in length, a term id is >= ``n_terms``, or ``doc``
            decreases (``scratch`` is left as it was).
    """
    if not (len(doc) == len(tid) == len(tf)):
        raise ValueError(f"doc, tid, tf lengths differ: {len(doc)}, {len(tid)}, {len(tf)}")
    if len(doc) and int(tid.max()) >= n_terms:
        raise ValueError(f"term id {int(tid.max())} out of range (n_terms = {n_terms})")
    scratch.ensure(n_terms)
    nnz = len(doc)
    out_doc = np.empty(nnz, dtype=np.uint32)
    out_tf = np.empty(nnz, dtype=np.uint32)
    terms = np.empty(min(nnz, n_terms), dtype=np.uint32)
    offsets = np.empty(len(terms) + 1, dtype=np.uint64)
    k = _csr_compact(doc, tid, tf, scratch.count, scratch.bits, out_doc, out_tf, terms, offsets)
    if k < 0:
        raise ValueError("documents not in ascending order")
    return terms[:k].copy(), offsets[:k + 1].copy(), out_doc, out_tf


@nb.njit(cache=True, nogil=True)
def _masked_df(offsets, doc_ids, mask, counts):
    n = mask.shape[0]
    for t in range(offsets.shape[0] - 1):
        c = 0
        for p in range(offsets[t], offsets[t + 1]):
            d = doc_ids[p]
            if d >= n:
                return False
            c += mask[d]
        counts[t] = c
    return True


def masked_df(offsets: np.ndarray, doc_ids: np.ndarray, rows: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-term document frequency of a subset of a shard's documents, from its CSR postings: for
    each term t, how many of ``rows`` appear in ``doc_ids[offsets[t]:offsets[t+1]]`` (a document
    occurs at most once per term's list). One compiled pass over the postings, no temporaries of
    their size (the numpy form, a gather of a mask through every doc id, cost ~5x more).

    Args:
        offsets: u64[T+1] CSR offsets, non-decreasing, ``offsets[-1] == len(doc_ids)``.
        doc_ids: u32[nnz] document rows of the postings, each < ``n_docs``.
        rows: integer rows of the subset (repeats allowed), each in ``[0, n_docs)``.
        n_docs: rows of the shard.

    Returns:
        u32[T]: the count of each term.

    Raises:
        ValueError: offsets not a valid CSR over ``doc_ids``, or a row / doc id out of range.
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
    doc_ids = np.ascontiguousarray(doc_ids, dtype=np.uint32)
    if len(offsets) == 0 or int(offsets[0]) != 0 or int(offsets[-1]) != len(doc_ids) \
            or (len(offsets) > 1 and bool(np.any(offsets[1:] < offsets[:-1]))):
        raise ValueError(f"offsets are not CSR offsets over {len(doc_ids)} postings")
    rows = np.asarray(rows)
    if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n_docs):
        raise ValueError(f"rows out of range [0, {n_docs})")
    mask = np.zeros(n_docs, dtype=np.uint8)
    mask[rows] = 1
    counts = np.empty(len(offsets) - 1, dtype=np.uint32)
    if not _masked_df(offsets, doc_ids, mask, counts):
        raise ValueError(f"doc id {int(doc_ids.max())} out of range (n_docs = {n_docs})")
    return counts


@nb.njit(cache=True)
def _query_term_weights(term_ids, counts, idf, slot):
    nq = counts.shape[0]
    m_max = term_ids.shape[0]
    q_off = np.zeros(nq + 1, dtype=np.uint64)
    q_terms = np.empty(m_max, dtype=np.uint32)
    q_weights = np.empty(m_max, dtype=np.float32)
    occ = np.empty(m_max, dtype=np.int64)
    m = 0
    p = 0
    for q in range(nq):
        start = m
        for _ in range(counts[q]):
            t = term_ids[p]
            p += 1
            if t < 0:
                continue
            j = slot[t]
            if j >= 0:
                occ[j] += 1
            else:
                slot[t] = m
                q_terms[m] = t
                occ[m] = 1
                m += 1
        for j in range(start, m):
            t = q_terms[j]
            slot[t] = -1
            q_weights[j] = np.float32(np.float64(occ[j]) * np.float64(idf[t]))
        q_off[q + 1] = m
    return q_off, q_terms[:m], q_weights[:m]


def query_term_weights(term_ids: np.ndarray, counts: np.ndarray, idf: np.ndarray,
                       slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query, its distinct terms (first-occurrence order) weighted by occurrences x idf.

    The weight of a term is ``float32(float64(n) * float64(idf[t]))`` for a term occurring n times
    in the query, the query-side factor of Lucene's BM25 with repeated query terms. One pass over
    the token stream; ``slot`` maps a term to its position in the current query and is restored
    to all -1 before returning.

    Args:
        term_ids: i64[m] term id of each token occurrence, queries one after another
            (-1: not indexed, e.g. a stop word).
        counts: i64[nq] tokens per query (sum = m).
        idf: f32[n_terms] idf of each term.
        slot: i64[n_terms] scratch, all -1 (left all -1).

    Returns:
        ``(q_offsets u64[nq+1], q_terms u32[k], q_weights f32[k])``: query j's terms are
        ``q_terms[q_offsets[j]:q_offsets[j+1]]``.

    Raises:
        ValueError: ``counts`` does not sum to ``len(term_ids)``, ``slot`` and ``idf`` differ in
            length, or a term id is >= ``len(idf)``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) and (int(counts.min()) < 0 or int(counts.sum()) != len(term_ids)):
        raise ValueError(f"counts must be >= 0 and sum to len(term_ids) = {len(term_ids)}")
    if len(slot) != len(idf):
        raise ValueError(f"slot has {len(slot)} entries, idf has {len(idf)}")
    term_ids = np.asarray(term_ids, dtype=np.int64)
    if len(term_ids) and int(term_ids.max()) >= len(idf):
        raise ValueError(f"term id {int(term_ids.max())} out of range (len(idf) = {len(idf)})")
    return _query_term_weights(term_ids, counts,
                               np.asarray(idf, dtype=np.float32), slot)
