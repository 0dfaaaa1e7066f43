"""Fixtures of the framework adapter tests: one small hybrid index (BM25 + dense + learned sparse,
the bundled models), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from integrations.rag_data import rag_corpus


@pytest.fixture(scope="session")
def rag_index(tmp_path_factory) -> Path:
    from retriever import build_index

    out = tmp_path_factory.mktemp("rag") / "hybrid"
    build_index(rag_corpus(), out, legs=("bm25", "dense", "sparse"), shard_size=80, show_progress=False)
    return out


@pytest.fixture(scope="session")
def rag_retriever(rag_index):
    from retriever import Retriever

    # legs one after another: with legs side by side, the learned-sparse leg's query encoding runs
    # on a pool thread whose OpenMP thread count varies between calls, and the SPLADE encoder's
    # float32 sums (the last digits of its scores) depend on it; exact comparisons need one order
    with Retriever.open(rag_index, concurrent_legs=False) as r:
        yield r
