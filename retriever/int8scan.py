"""int8-quantised Matryoshka prefixes for funnel candidate generation (``scan_dtype="int8"``).

The exact prefix scan of a funnel search (:func:`retriever.legs.dense._prefix_scan`) spends
almost all of its time in the float32 inner products of every query with every document prefix.
Here the re-normalised prefixes are scalar-quantised to int8 (per coordinate, symmetric: the
scale of coordinate ``t`` is ``max_d |p_dt| / 127``, as in FAISS' ``SQ8`` family and the
int8 re-ranking of ScaNN-style pipelines) and queries to int8 per query, and the scan runs as
exact integer dot products in the C++ kernel ``retriever._kernels.int8_scan_topk`` (AVX-512 VNNI
``vpdpbusd`` where the CPU has it: 64 multiply-adds per instruction against 16 in float32).
Integer arithmetic is exact, so the candidates do not depend on the code path, the batch or the
thread count. Quantisation only changes which documents make the shortlist; the final scores are
still exact full-dimension inner products (``rescore_topk``), and the shortlist compensates for
the small ranking noise (see benchmarks/bench_dense.py for recall against exact search).

Score model: with ``s_t`` the coordinate scales, ``c_dt = round(p_dt / s_t)`` in [-127, 127]
(stored as ``c_dt + 128``), ``u_it = p_it * s_t`` and ``a_i = max_t |u_it| / 127``,
``q_it = round(u_it / a_i)``: ``p_i · p_d ≈ a_i * sum_t q_it * c_dt``. The kernel computes
``sum_t q_it * (c_dt + 128)``; the per-query constant ``128 * sum_t q_it`` is subtracted only
when the approximate prefix scores are returned (``rescore=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retriever.index.errors import ConfigError, QueryError

from . import _kernels

#: documents per packed block of the kernel layout (cpp_ext/int8_scan.hpp).
BLOCK_DOCS = 16
#: rows quantised per step while building (bounds the float32 temporaries to ~64 MiB at d=256).
BUILD_CHUNK = 65536


@dataclass(frozen=True)
class Int8Prefix:
    """Quantised prefixes of one shard.

    Attributes:
        codes: uint8 (ceil(n / 16), d4, 64) codes in the kernel's packed layout.
        scale: float32 (dim,) per-coordinate scales ``s_t`` (>= 0; 0 only for an all-zero column).
        n: rows.
        dim: prefix length (coordinates); ``d4 = ceil(dim / 4)``, padding coordinates are zero.
    """

    codes: np.ndarray
    scale: np.ndarray
    n: int
    dim: int

    @property
    def nbytes(self) -> int:
        """Bytes held by the codes and scales."""
        return int(self.codes.nbytes + self.scale.nbytes)


def quantize_prefix(prefix: np.ndarray) -> Int8Prefix:
    """Quantise re-normalised document prefixes to the packed int8 layout.

    Args:
        prefix: float32 (n, dim) prefixes (typically unit rows from
            :func:`retriever.index.matryoshka.prefix_normalize`), n >= 1, finite.

    Returns:
        the :class:`Int8Prefix` (scale ``max |column| / 127``; 0 for an all-zero column, whose
        codes are 0).

    Raises:
        ConfigError: not a non-empty finite 2-D array (names the shape).
    """
    p = np.asarray(prefix, dtype=np.float32)
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
        raise ConfigError(f"int8 prefix: need a non-empty (n, dim) array, got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ConfigError("int8 prefix: prefixes contain NaN or inf")
    n, dim = p.shape
    amax = np.abs(p).max(axis=0)
    # an all-zero column gets scale 0: its codes are 0 and queries give it no weight
    scale = (amax / np.float32(127)).astype(np.float32)
    nonzero = np.broadcast_to(scale > 0, (min(n, BUILD_CHUNK), dim))
    d4 = (dim + 3) // 4
    nb = (n + BLOCK_DOCS - 1) // BLOCK_DOCS
    flat = np.full((nb * BLOCK_DOCS, d4 * 4), 128, np.uint8)  # 128 = code 0 (padding)
    for a in range(0, n, BUILD_CHUNK):
        b = min(n, a + BUILD_CHUNK)
        c = np.divide(p[a:b], scale, out=np.zeros((b - a, dim), np.float32), where=nonzero[: b - a])
        c = np.clip(np.rint(c), -127, 127)
        flat[a:b, :dim] = (c + 128).astype(np.uint8)
    # (block, doc, group, 4) -> (block, group, doc, 4): 16 documents x 4 coordinates per 64 bytes
    codes = np.ascontiguousarray(flat.reshape(nb, BLOCK_DOCS, d4, 4).transpose(0, 2, 1, 3)).reshape(nb, d4, 64)
    return Int8Prefix(codes=codes, scale=scale, n=n, dim=dim)


def quantize_queries(qp: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-query int8 codes of re-normalised query prefixes.

    Args:
        qp: float32 (nq, dim) query prefixes.
        scale: float32 (dim,) the documents' coordinate scales.

    Returns:
        ``(q8 int8 (nq, 4 * ceil(dim / 4)) zero-padded, a float64 (nq,))`` with
        ``qp · p ≈ a * (q8 · c)``; each row depends only on that query.

    Raises:
        QueryError: shapes that do not match (names them).
    """
    qp = np.asarray(qp, dtype=np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    if qp.ndim != 2 or scale.ndim != 1 or qp.shape[1] != scale.shape[0]:
        raise QueryError(f"int8 queries: need (nq, dim) and (dim,), got {qp.shape} and {scale.shape}")
    u = qp * scale
    amax = np.abs(u).max(axis=1) if u.shape[1] else np.zeros(len(u), np.float32)
    a = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    dim = qp.shape[1]
    q8 = np.zeros((qp.shape[0], 4 * ((dim + 3) // 4)), np.int8)
    q8[:, :dim] = np.clip(np.rint(u / a[:, None]), -127, 127).astype(np.int8)
    return q8, a.astype(np.float64)


def int8_scan(pref: Int8Prefix, qp: np.ndarray, kk: int, n_threads: int, impl: str = "auto",
              allow: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-``kk`` candidates of each query by quantised prefix inner product.

    Args:
        pref: the shard's quantised prefixes.
        qp: float32 (nq, dim) re-normalised query prefixes.
        kk: candidates per query, ``1 <= kk <= pref.n``.
        n_threads: kernel threads (<= 0: all cores).
        impl: kernel code path, ``"auto"``, ``"portable"`` or ``"vnni"`` (identical results).
        allow: uint8 (n,) mask (0 = never a candidate, applied in the kernel before top-kk), or
            None; a row with fewer than ``kk`` allowed documents ends in id -1, score -inf.

    Returns:
        ``(D float32 (nq, kk) approximate prefix inner products, I int64 (nq, kk) shard-local
        ordinals)``, rows sorted by integer score descending then ordinal.

    Raises:
        QueryError: ``kk`` out of range or a query dim that does not match (names the value).
    """
    if not 1 <= kk <= pref.n:
        raise QueryError(f"int8 scan: kk must be in [1, {pref.n}], got {kk}")
    if qp.ndim != 2 or qp.shape[1] != pref.dim:
        raise QueryError(f"int8 scan: query prefixes must have shape (nq, {pref.dim}), got {qp.shape}")
    q8, a = quantize_queries(qp, pref.scale)
    S, I = _kernels.int8_scan_topk(q8, pref.codes, pref.n, kk, n_threads, impl, allow)
    offset = 128 * q8.sum(axis=1, dtype=np.int64)
    D = ((S.astype(np.int64) - offset[:, None]) * a[:, None]).astype(np.float32)
    if allow is not None:
        D[I < 0] = -np.inf
    return D, I
