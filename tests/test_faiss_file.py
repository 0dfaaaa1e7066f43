"""A FAISS index file is checked against the manifest's SHA-256 before FAISS parses it
(FAISS sizes its allocations from the file's own header)."""

from __future__ import annotations

import numpy as np
import pytest

from retriever import BuildConfig, DenseConfig, IndexFormatError, Retriever, build_index


def test_forged_faiss_file_refused_at_open(tmp_path):
    rng = np.random.default_rng(0)
    docs = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(64)]
    vecs = rng.standard_normal((64, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    cfg = BuildConfig(legs=("dense",), dense=DenseConfig(faiss_factory="IVF4,Flat", dtype="float32"))
    build_index(docs, tmp_path / "i", cfg, dense_vectors=vecs, show_progress=False)
    r = Retriever.open(tmp_path / "i")
    res = r.search_arrays(["x"], k=3, mode="dense", query_vectors=vecs[:1],
                          leg_params={"dense": {"nprobe": 4}})
    assert res.ids[0, 0] == 0
    f = tmp_path / "i" / "shards" / "00000" / "dense.faiss"
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0xFF  # same size, different content: only the digest can tell
    f.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="dense.faiss"):
        Retriever.open(tmp_path / "i")
