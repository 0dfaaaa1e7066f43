"""Reading a shard's ``dense.faiss`` without letting its header choose an allocation.

FAISS's reader allocates (and zero-fills) whatever length a vector field of the file claims
before it reads the data (``READVECTOR``: read the size, ``resize``, read), and an inverted-list
file declares every list's length before any list is read. One rewritten size field in a 75 KB
file was enough for 12 GB of RSS inside ``Retriever.open``. The SHA-256 in the manifest does not
help when the manifest is rewritten too.

So :func:`check_faiss_bytes` walks the serialised index first, for the index types a build
writes (flat, IVF-Flat, IVF-PQ, IVF-SQ, PQ, SQ, HNSW-Flat, a pre-transform such as PCA or a
random rotation in front of one of them, and a flat refinement around one), in the order FAISS's
``read_index`` reads them (``faiss/impl/index_read.cpp``), and checks every length against the
bytes left in the file and against ``d`` and ``ntotal`` (codes = ntotal x code size, one list
size per IVF list and their sum = ntotal, the quantizer's ntotal = nlist, HNSW offsets and
neighbour ids inside the graph, scalar-quantizer tables of the size the decoder reads, ...). The
walk must consume the file exactly. Only then are the same bytes handed to
``faiss.deserialize_index``. Any other index type is refused (the build refuses such factory
strings up front, :func:`check_buildable`).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, IndexFormatError

#: deepest nesting of indexes (refine → pre-transform → IVF → quantizer)
MAX_NESTING = 5
#: most vector transforms in a pre-transform chain
MAX_TRANSFORMS = 8
#: largest HNSW efSearch accepted from a file (the search default when no efSearch is given)
MAX_EF_SEARCH = 1 << 16
#: scalar-quantizer types: qtype -> (code size for d, size of the ``trained`` table for d)
_SQ_TYPES = {
    0: (lambda d: d, lambda d: 2 * d),               # QT_8bit
    1: (lambda d: (d + 1) // 2, lambda d: 2 * d),    # QT_4bit
    2: (lambda d: d, lambda d: 2),                   # QT_8bit_uniform
    3: (lambda d: (d + 1) // 2, lambda d: 2),        # QT_4bit_uniform
    4: (lambda d: 2 * d, lambda d: 0),               # QT_fp16
    5: (lambda d: d, lambda d: 0),                   # QT_8bit_direct
    6: (lambda d: (d * 6 + 7) // 8, lambda d: 2 * d),  # QT_6bit
    7: (lambda d: 2 * d, lambda d: 0),               # QT_bf16
    8: (lambda d: d, lambda d: 0),                   # QT_8bit_direct_signed
}


class _Bytes:
    """A cursor over the file's bytes; every read is bounded by what is left."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        self.data = memoryview(data)
        self.pos = 0

    def fail(self, msg: str) -> IndexFormatError:
        return IndexFormatError(f"{self.path}: FAISS index refused at byte {self.pos}: {msg}")

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.left:
            raise self.fail(f"{what} needs {n} bytes, {self.left} left (truncated or a forged size)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size, what))[0]

    def fourcc(self) -> bytes:
        return bytes(self.take(4, "a type tag"))

    def vector(self, elem: int, what: str, *, count: int | None = None, dtype: Any = None) -> np.ndarray | int:
        """A FAISS ``READVECTOR``: u64 size, then size elements of ``elem`` bytes. The size is
        checked against the bytes left (and ``count`` when known) before anything is taken.
        Returns the elements as ``dtype`` (a copy) or, without ``dtype``, their number."""
        n = self.scalar("Q", f"the length of {what}")
        if count is not None and n != count:
            raise self.fail(f"{what} has {n} elements, expected {count}")
        if n > self.left // max(elem, 1):
            raise self.fail(f"{what} claims {n} elements of {elem} bytes, only {self.left} bytes left")
        raw = self.take(n * elem, what)
        if dtype is None:
            return int(n)
        return np.frombuffer(raw, dtype=dtype).copy()


def _header(b: _Bytes, d: int | None, ntotal: int | None, what: str) -> tuple[int, int, int]:
    """``read_index_header``: returns (d, ntotal, metric)."""
    dd = b.scalar("i", f"{what} d")
    nt = b.scalar("q", f"{what} ntotal")
    b.scalar("q", "a reserved field")
    b.scalar("q", "a reserved field")
    b.scalar("B", f"{what} is_trained")
    metric = b.scalar("i", f"{what} metric")
    if metric > 1:
        b.scalar("f", f"{what} metric_arg")
    if metric != 0:  # METRIC_INNER_PRODUCT
        raise b.fail(f"{what} has metric {metric}, expected inner product (0)")
    if dd < 1 or (d is not None and dd != d):
        raise b.fail(f"{what} has d={dd}, expected {d}")
    if nt < 0 or (ntotal is not None and nt != ntotal):
        raise b.fail(f"{what} has ntotal={nt}, expected {ntotal}")
    return dd, nt, metric


def _pq(b: _Bytes, d: int) -> tuple[int, int, int]:
    """``read_ProductQuantizer``: returns (M, ksub, code_size)."""
    pd = b.scalar("Q", "PQ d")
    M = b.scalar("Q", "PQ M")
    nbits = b.scalar("Q", "PQ nbits")
    if pd != d or not 1 <= M <= d or d % M or not 1 <= nbits <= 16:
        raise b.fail(f"product quantizer with d={pd} M={M} nbits={nbits} (index d={d})")
    ksub = 1 << nbits
    b.vector(4, "PQ centroids", count=d * ksub)
    return M, ksub, (M * nbits + 7) // 8


def _sq(b: _Bytes, d: int) -> int:
    """``read_ScalarQuantizer``: returns the code size."""
    qtype = b.scalar("i", "SQ type")
    b.scalar("i", "SQ range statistic")
    b.scalar("f", "SQ range argument")
    sd = b.scalar("Q", "SQ d")
    code_size = b.scalar("Q", "SQ code size")
    if qtype not in _SQ_TYPES or sd != d:
        raise b.fail(f"scalar quantizer of type {qtype}, d={sd} (index d={d})")
    want_code, want_trained = _SQ_TYPES[qtype]
    if code_size != want_code(d):
        raise b.fail(f"scalar quantizer code size {code_size}, expected {want_code(d)}")
    trained = b.vector(4, "SQ trained table", dtype=np.float32)
    if len(trained) != want_trained(d) or not np.isfinite(trained).all():
        raise b.fail(f"scalar quantizer table of {len(trained)} values, expected {want_trained(d)} finite ones")
    return code_size


def _invlists(b: _Bytes, nlist: int, code_size: int, ntotal: int, rows: int) -> None:
    """``read_InvertedLists`` for ``ilar`` (array inverted lists)."""
    tag = b.fourcc()
    if tag != b"ilar":
        raise b.fail(f"inverted lists of type {tag!r}, expected b'ilar'")
    n = b.scalar("Q", "inverted lists nlist")
    cs = b.scalar("Q", "inverted lists code size")
    if n != nlist or cs != code_size:
        raise b.fail(f"inverted lists with nlist={n} code_size={cs}, expected {nlist} / {code_size}")
    kind = b.fourcc()
    if kind == b"full":
        sizes = b.vector(8, "list sizes", count=nlist, dtype="<u8")
    elif kind == b"sprs":
        pairs = b.vector(8, "list sizes", dtype="<u8")
        if len(pairs) % 2 or (len(pairs) and int(pairs[0::2].max()) >= nlist):
            raise b.fail("sparse list sizes name a list outside [0, nlist)")
        sizes = np.zeros(nlist, dtype=np.uint64)
        sizes[pairs[0::2].astype(np.int64)] = pairs[1::2]
    else:
        raise b.fail(f"list sizes of kind {kind!r}")
    # the sum is checked without overflow: each size is at most the bytes left
    per = code_size + 8
    if len(sizes) and int(sizes.max()) > b.left // per:
        raise b.fail(f"an inverted list claims {int(sizes.max())} entries, only {b.left} bytes left")
    total = int(sizes.sum(dtype=np.uint64)) if len(sizes) else 0
    if total != ntotal:
        raise b.fail(f"inverted lists hold {total} entries, ntotal is {ntotal}")
    if total * per > b.left:
        raise b.fail(f"inverted lists need {total * per} bytes, {b.left} left")
    for i in np.flatnonzero(sizes).tolist():
        m = int(sizes[i])
        b.take(m * code_size, f"codes of list {i}")
        ids = np.frombuffer(b.take(m * 8, f"ids of list {i}"), dtype="<i8")
        if ids.min() < 0 or ids.max() >= rows:
            raise b.fail(f"list {i} holds id {int(ids.min() if ids.min() < 0 else ids.max())}, outside the "
                         f"shard's {rows} rows")


def _ivf_header(b: _Bytes, d: int, ntotal: int, depth: int) -> int:
    """``read_ivf_header``: returns nlist."""
    _header(b, d, ntotal, "IVF index")
    nlist = b.scalar("Q", "nlist")
    b.scalar("Q", "nprobe")
    if not 1 <= nlist <= b.left:
        raise b.fail(f"nlist={nlist}")
    _index(b, d, nlist, nlist, depth + 1, flat_only=True)  # the coarse quantizer: nlist centroids
    dm = b.scalar("b", "direct map type")
    n = b.vector(8, "direct map")
    if dm != 0 or n:
        raise b.fail(f"a direct map (type {dm}, {n} entries): not written by a build")
    return nlist


def _hnsw(b: _Bytes, ntotal: int) -> None:
    """``read_HNSW``: the graph's arrays, checked so that a search stays inside them."""
    b.vector(8, "HNSW assign_probas")
    cum = b.vector(4, "HNSW cum_nneighbor_per_level", dtype="<i4")
    levels = b.vector(4, "HNSW levels", count=ntotal, dtype="<i4")
    offsets = b.vector(8, "HNSW offsets", count=ntotal + 1, dtype="<u8")
    neighbors = b.vector(4, "HNSW neighbors", dtype="<i4")
    entry = b.scalar("i", "HNSW entry point")
    max_level = b.scalar("i", "HNSW max level")
    b.scalar("i", "HNSW efConstruction")
    ef = b.scalar("i", "HNSW efSearch")
    b.scalar("i", "a reserved field")
    if len(cum) < 1 or cum[0] != 0 or (np.diff(cum) < 0).any():
        raise b.fail("HNSW neighbour counts per level are not ascending from 0")
    if ntotal:
        if levels.min() < 1 or levels.max() >= len(cum) or max_level != int(levels.max()) - 1:
            raise b.fail(f"HNSW levels outside [1, {len(cum) - 1}] or max level {max_level} inconsistent")
        if offsets[0] != 0 or (np.diff(offsets.astype(np.int64)) != cum[levels]).any():
            raise b.fail("HNSW offsets do not match the levels")
        if not 0 <= entry < ntotal:
            raise b.fail(f"HNSW entry point {entry} outside [0, {ntotal})")
    elif entry != -1 or len(neighbors):
        raise b.fail("an empty HNSW graph with an entry point or neighbours")
    if int(offsets[-1]) != len(neighbors):
        raise b.fail(f"HNSW has {len(neighbors)} neighbour slots, offsets say {int(offsets[-1])}")
    if len(neighbors) and (neighbors.min() < -1 or neighbors.max() >= ntotal):
        raise b.fail(f"HNSW neighbour id outside [-1, {ntotal})")
    if not 1 <= ef <= MAX_EF_SEARCH:
        raise b.fail(f"HNSW efSearch={ef}, expected 1..{MAX_EF_SEARCH}")


def _transform(b: _Bytes, d_in: int) -> int:
    """``read_VectorTransform`` (linear ones: PCA, random rotation, plain linear; normalisation;
    centering): returns d_out."""
    tag = b.fourcc()
    if tag in (b"PCAm", b"PcAm", b"Pcam", b"rrot", b"LTra"):
        if tag != b"rrot" and tag != b"LTra":
            b.scalar("f", "PCA eigen_power")
            if tag == b"Pcam":
                b.scalar("f", "PCA epsilon")
            b.scalar("B", "PCA random_rotation")
            if tag != b"PCAm":
                b.scalar("i", "PCA balanced_bins")
            b.vector(4, "PCA mean")
            b.vector(4, "PCA eigenvalues")
            b.vector(4, "PCA matrix")
        have_bias = b.scalar("B", "transform have_bias")
        a = b.vector(4, "transform matrix")
        nb = b.vector(4, "transform bias")
        di, do, _ = b.scalar("i", "transform d_in"), b.scalar("i", "transform d_out"), b.scalar("B", "is_trained")
        if di != d_in or not 1 <= do <= di or a != di * do or (have_bias and nb != do):
            raise b.fail(f"linear transform {di} -> {do} with {a} matrix and {nb} bias values (input d={d_in})")
        return do
    if tag == b"VNrm":
        b.scalar("f", "normalisation norm")
    elif tag == b"VCnt":
        b.vector(4, "centering mean", count=d_in)
    else:
        raise b.fail(f"vector transform {tag!r} not accepted")
    di, do, _ = b.scalar("i", "transform d_in"), b.scalar("i", "transform d_out"), b.scalar("B", "is_trained")
    if di != d_in or do != d_in:
        raise b.fail(f"transform {di} -> {do} (input d={d_in})")
    return do


def _index(b: _Bytes, d: int, ntotal: int, rows: int, depth: int, *, flat_only: bool = False) -> str:
    """One index of the accepted types (recursively): returns its type tag."""
    if depth > MAX_NESTING:
        raise b.fail("indexes nested too deeply")
    tag = b.fourcc()
    if tag in (b"IxFI", b"IxFl"):
        _header(b, d, ntotal, "flat index")
        n = b.scalar("Q", "flat codes length")
        if n != ntotal * d:
            raise b.fail(f"flat index codes of {n} floats, expected ntotal x d = {ntotal * d}")
        b.take(4 * n, "flat index codes")
        return tag.decode()
    if flat_only:
        raise b.fail(f"index type {tag!r} where a flat index is expected")
    if tag == b"IwFl":
        nlist = _ivf_header(b, d, ntotal, depth)
        _invlists(b, nlist, 4 * d, ntotal, rows)
    elif tag == b"IwPQ":
        nlist = _ivf_header(b, d, ntotal, depth)
        b.scalar("B", "by_residual")
        code_size = b.scalar("Q", "code size")
        M, ksub, pq_code = _pq(b, d)
        if code_size != pq_code:
            raise b.fail(f"IVF-PQ code size {code_size}, the PQ's is {pq_code}")
        if nlist * M * ksub * 4 > max(1 << 28, 16 * len(b.data)):  # FAISS's precomputed table
            raise b.fail(f"a precomputed table of nlist x M x ksub = {nlist * M * ksub} floats")
        _invlists(b, nlist, code_size, ntotal, rows)
    elif tag in (b"IwSq", b"IwSQ"):
        nlist = _ivf_header(b, d, ntotal, depth)
        sq_code = _sq(b, d)
        code_size = b.scalar("Q", "code size")
        if tag == b"IwSq":
            b.scalar("B", "by_residual")
        if code_size != sq_code:
            raise b.fail(f"IVF-SQ code size {code_size}, the SQ's is {sq_code}")
        _invlists(b, nlist, code_size, ntotal, rows)
    elif tag == b"IxPq":
        _header(b, d, ntotal, "PQ index")
        _M, _ksub, code_size = _pq(b, d)
        b.vector(1, "PQ codes", count=ntotal * code_size)
        b.scalar("i", "PQ search type")
        b.scalar("B", "PQ encode_signs")
        b.scalar("i", "PQ polysemous_ht")
    elif tag == b"IxSQ":
        _header(b, d, ntotal, "SQ index")
        code_size = _sq(b, d)
        b.vector(1, "SQ codes", count=ntotal * code_size)
    elif tag == b"IHNf":
        _header(b, d, ntotal, "HNSW index")
        _hnsw(b, ntotal)
        _index(b, d, ntotal, rows, depth + 1, flat_only=True)
    elif tag == b"IxPT":
        _header(b, d, ntotal, "pre-transform index")
        nt = b.scalar("i", "number of transforms")
        if not 1 <= nt <= MAX_TRANSFORMS:
            raise b.fail(f"{nt} vector transforms")
        dd = d
        for _ in range(nt):
            dd = _transform(b, dd)
        _index(b, dd, ntotal, rows, depth + 1)
    elif tag == b"IxRF":
        _header(b, d, ntotal, "refine index")
        _index(b, d, ntotal, rows, depth + 1)
        _index(b, d, ntotal, rows, depth + 1, flat_only=True)
        k = b.scalar("f", "refine k_factor")
        if not (math.isfinite(k) and 1.0 <= k <= 1e4):
            raise b.fail(f"refine k_factor={k}")
    else:
        raise b.fail(f"index type {tag!r} is not one this reader accepts (flat, IVF-Flat, IVF-PQ, IVF-SQ, "
                     f"PQ, SQ, HNSW-Flat, pre-transform, refine-flat)")
    return tag.decode()


def check_faiss_bytes(path: Path, data: bytes, d: int, ntotal: int) -> str:
    """Walk a serialised FAISS index and check every length in it (see the module docstring).

    Args:
        path: the file (for messages); ``data``: its bytes; ``d``: the dense dimension;
            ``ntotal``: the shard's row count (every stored id must be below it).

    Returns:
        the outermost index type tag (e.g. ``"IwFl"``).

    Raises:
        IndexFormatError: a type this reader does not accept, a length that does not fit, or
            bytes left over (names the file and the byte offset).
    """
    b = _Bytes(path, data)
    tag = _index(b, d, ntotal, ntotal, 0)
    if b.left:
        raise b.fail(f"{b.left} bytes after the end of the index")
    return tag


def read_faiss_index(files: Any, rel: str, d: int, ntotal: int) -> Any:
    """Read ``rel`` through an :class:`~retriever.index.safe_open.IndexFiles`, check it with
    :func:`check_faiss_bytes`, then deserialise the same bytes with FAISS.

    Raises:
        IndexFormatError: as :func:`check_faiss_bytes`, or FAISS refuses the bytes (names the file).
    """
    import faiss

    import hashlib

    path = files.path(rel)
    data = files.read_bytes(rel)
    # content against the manifest's digest (catches damage; a forger recomputes it, so the walk
    # below is what bounds FAISS's allocations)
    if files.listed is not None and hashlib.sha256(data).hexdigest() != files.listed[rel].get("sha256"):
        raise IndexFormatError(f"{path}: SHA-256 mismatch (file corrupted or modified)")
    check_faiss_bytes(path, data, d, ntotal)
    try:
        index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except (RuntimeError, MemoryError, ValueError) as e:
        raise IndexFormatError(f"{path}: unreadable FAISS index ({str(e).splitlines()[0] if str(e) else e})") from None
    if index.d != d or index.ntotal != ntotal:
        raise IndexFormatError(f"{path}: d={index.d} ntotal={index.ntotal}, expected d={d} ntotal={ntotal}")
    return index


def check_buildable(data: bytes, factory: str, d: int, ntotal: int) -> None:
    """Build-time check that the reader will accept a freshly serialised index.

    Raises:
        ConfigError: the factory string makes an index type (or layout) that
            :func:`check_faiss_bytes` refuses (names the factory string and the reason).
    """
    try:
        check_faiss_bytes(Path("dense.faiss"), data, d, ntotal)
    except IndexFormatError as e:
        raise ConfigError(f"FAISS factory {factory!r} builds an index that indexes cannot store: "
                          f"{str(e).split(': ', 1)[-1]}") from None
