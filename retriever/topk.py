"""Merging per-shard top-k lists into a global top-k (the FAISS ``merge_knn_results`` shape)."""

from __future__ import annotations

import numpy as np


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge shard results.

    Args:
        parts: per shard ``(ids int64 (nq, k_s), scores float32 (nq, k_s), n_found int32 (nq,))``
            with GLOBAL ordinals, rows padded with -1 / -inf.
        k: output length.

    Returns:
        ``(ids int64 (nq, k), scores float32 (nq, k), n_found int32 (nq,))``, rows sorted by score
        descending, ties by smaller ordinal, padded with -1 / -inf.
    """
    if len(parts) == 1 and parts[0][0].shape[1] == k:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts], axis=1)
    scores = np.concatenate([p[1] for p in parts], axis=1)
    nq = ids.shape[0]
    valid = ids >= 0
    # Sort each row by (-score, id) with padding last: lexsort's last key is primary.
    key_score = np.where(valid, -scores.astype(np.float64), np.inf)
    key_id = np.where(valid, ids, np.iinfo(np.int64).max)
    order = np.lexsort((key_id, key_score), axis=1)[:, :k]
    out_ids = np.full((nq, k), -1, dtype=np.int64)
    out_scores = np.full((nq, k), -np.inf, dtype=np.float32)
    m = order.shape[1]
    out_ids[:, :m] = np.take_along_axis(ids, order, axis=1)
    out_scores[:, :m] = np.take_along_axis(scores, order, axis=1)
    n_found = np.minimum(valid.sum(axis=1), k).astype(np.int32)
    pad = np.arange(k)[None, :] >= n_found[:, None]
    out_ids[pad] = -1
    out_scores[pad] = -np.inf
    return out_ids, out_scores, n_found
