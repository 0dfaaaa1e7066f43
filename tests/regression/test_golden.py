"""Every search result unchanged: top-k ids and scores against results captured from earlier code.

For each shared collection (SciFact, Cranfield, CISI, MED) the three-leg index (BM25, dense,
learned sparse) is rebuilt from the stored document vectors (``vectors/``; no model runs) with
one shard and with four uneven shards, and every case of ``golden_cases.CASES`` (every mode,
every BM25 algorithm, exact and Seismic sparse, dense funnels, every fusion method, weights,
depth) is compared with ``golden/<collection>.npz``: document ids, n_found, per-leg ranks equal;
fused, leg and per-leg scores bit-identical as float32 (no tolerance). Approximate cases are
compared exactly too: the same code on the same inputs must return the same numbers.

Re-capture (only when a change of results is intended and explained): see
``tests/regression/capture_golden.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.regression import golden_cases as G


def _check(expected: dict[str, np.ndarray], got: dict[str, np.ndarray], what: str) -> None:
    diff = G.differences(expected, got)
    assert not diff, f"{what}: results differ from the golden capture:\n  " + "\n  ".join(diff[:10])


def _golden_of(golden: dict[str, np.ndarray], layout: str, case: str) -> dict[str, np.ndarray]:
    prefix = G.key(layout, case, "")
    fields = {k[len(prefix):]: v for k, v in golden.items() if k.startswith(prefix)}
    return {f.replace("~", ":"): v for f, v in fields.items()}


@pytest.fixture(scope="module")
def manifest() -> dict:
    if not G.MANIFEST.is_file():
        pytest.fail(f"{G.MANIFEST.name} missing: run python -m tests.regression.capture_golden")
    return G.load_manifest()


def test_capture_is_complete(manifest) -> None:
    """The golden files hold every collection and case this test checks, captured without problems."""
    assert manifest["k"] == G.K and manifest["legs"] == list(G.LEGS)
    assert sorted(manifest["collections"]) == sorted(G.COLLECTIONS)
    assert [c["name"] for c in manifest["cases"]] == [c.name for c in G.CASES]
    assert manifest["problems"] == []
    for c in G.COLLECTIONS:
        assert (G.VECTORS / f"{c}.npz").is_file() and (G.GOLDEN / f"{c}.npz").is_file(), c


@pytest.mark.parametrize("collection", G.COLLECTIONS)
def test_results_unchanged(collection: str, data_dir: Path, tmp_path: Path, manifest) -> None:
    """Every case in every layout returns the captured ids and bit-identical scores."""
    from retriever import Retriever

    vec = G.load_vectors(collection)
    qids, queries = G.judged_queries(collection)
    golden = G.load_golden(collection)
    assert list(golden["query_ids"]) == qids, f"{collection}: judged queries changed"
    info = manifest["collections"][collection]
    for layout, shard_size in G.layouts(len(vec["doc_ids"])).items():
        built = G.build(collection, tmp_path / layout, shard_size, vec)
        assert [s["rows"] for s in built["shards"]] == info["layouts"][layout]["rows"], (collection, layout)
        svec = G.sparse_query_matrix(vec["sparse_queries"], int(built["stats"]["sparse_vocab_size"]))
        with Retriever.open(tmp_path / layout) as r:
            for case in G.CASES:
                res = G.result_arrays(r, case.search(r, queries, vec["dense_queries"], svec))
                _check(_golden_of(golden, layout, case.name), res, f"{collection} {layout} {case.name}")
            # the engine's documented invariances, against the same golden arrays: a second BM25
            # call (the compiled analyse-and-score path once the token table is filled) and the
            # hybrid cases with two threads (legs side by side)
            for case in G.CASES:
                if case.mode == "bm25" or (case.mode == "hybrid" and layout == "one"):
                    res = G.result_arrays(r, case.search(r, queries, vec["dense_queries"], svec, n_threads=2))
                    _check(_golden_of(golden, layout, case.name), res,
                           f"{collection} {layout} {case.name} (again, 2 threads)")
