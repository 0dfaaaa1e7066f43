"""What the golden-result regression captures and checks: collections, shard layouts, search cases.

Shared by :mod:`tests.regression.capture_golden` (writes ``vectors/`` and ``golden/``) and
``tests/regression/test_golden.py`` (rebuilds the same indexes and compares). Indexes are built
from the stored document vectors (no model runs at build or query time), so the check costs only
the build and the searches.

Files:
  ``vectors/<collection>.npz``  document and query vectors of the bundled models (see
      :func:`load_vectors`): dense documents float16 (as the index stores them), dense queries
      float32 (as the query encoder returns them), SPLADE documents and queries as CSR triples.
  ``golden/<collection>.npz``  per layout and case: ``ids`` (document id strings, ``""`` past
      ``n_found``), ``scores`` float32, ``n_found`` int32, and for every leg that ran its
      ``leg_scores`` float32 (NaN where the leg did not return the hit) and ``leg_ranks`` int32.
  ``golden/manifest.json``  what was captured: cases, layouts, k, the code commit, model hashes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = Path(os.environ.get("RETRIEVER_DATA", ROOT.parent / "shared" / "data"))
VECTORS = HERE / "vectors"
GOLDEN = HERE / "golden"
MANIFEST = GOLDEN / "manifest.json"

#: the four shared collections (folder names under the data directory)
COLLECTIONS = ("scifact", "cranfield", "cisi", "medline")
#: hits per query
K = 10
#: legs of every index
LEGS = ("bm25", "dense", "sparse")
#: kernel threads of every search (other counts are checked against these results)
N_THREADS = 1
#: fusion weights of the weighted cases (per leg; legs not named weigh 1.0)
WEIGHTS = {"bm25": 1.0, "dense": 0.5, "sparse": 0.25}


@dataclasses.dataclass(frozen=True)
class Case:
    """One search configuration.

    Attributes:
        name: key in the golden files.
        mode: ``Retriever.search_arrays`` mode.
        fusion: ``"rrf"``, ``"linear"``, ``"linear:zscore"``, ``"linear:none"``, or a dict
            ``{"method": "rrf"|"linear", "norm": ..., "weights": {...}}`` (see :meth:`fusion_arg`).
        leg_params: per-leg options, as ``search_arrays`` takes them.
        depth: candidates per leg before fusion (None: the default).
        exact: every leg of the case searches exactly (results must not depend on the shard
            layout); False where a leg is approximate (Seismic, a funnel over a prefix).
    """

    name: str
    mode: str
    fusion: Any = None
    leg_params: dict[str, dict[str, Any]] | None = None
    depth: int | None = None
    exact: bool = True

    def fusion_arg(self) -> Any:
        """The ``fusion`` argument of ``search_arrays`` (an RRF / Linear object for a dict)."""
        if not isinstance(self.fusion, dict):
            return self.fusion
        from retriever.fusion import RRF, Linear

        f = dict(self.fusion)
        method = f.pop("method")
        return RRF(**f) if method == "rrf" else Linear(**f)

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (for ``golden/manifest.json``)."""
        return dataclasses.asdict(self)

    def search(self, retriever: Any, queries: list[str], qvec: np.ndarray, svec: Any,
               n_threads: int = N_THREADS) -> Any:
        """Run the case: ``retriever.search_arrays`` with the stored query vectors."""
        return retriever.search_arrays(queries, K, mode=self.mode, fusion=self.fusion_arg(), depth=self.depth,
                                       n_threads=n_threads, query_vectors=qvec, sparse_vectors=svec,
                                       leg_params=self.leg_params)


CASES: tuple[Case, ...] = (
    # BM25: "auto" (exhaustive on collections this small) and every exact algorithm by name
    Case("bm25", "bm25"),
    *(Case(f"bm25:{a}", "bm25", leg_params={"bm25": {"algorithm": a}})
      for a in ("exhaustive", "maxscore", "bmw", "bmm")),
    # dense: the index's own structure (FAISS Flat) re-scored exactly; funnels over a 128-d prefix
    # (float32 and int8 prefix scans, shortlist re-scored at full dimension) are approximate
    Case("dense", "dense"),
    Case("dense:funnel128", "dense", leg_params={"dense": {"dim": 128}}, exact=False),
    Case("dense:funnel128:int8", "dense", leg_params={"dense": {"dim": 128, "scan_dtype": "int8"}}, exact=False),
    # learned sparse: exact (default) and Seismic-style approximate at its default knobs
    Case("sparse", "sparse"),
    Case("sparse:exact", "sparse", leg_params={"sparse": {"algorithm": "exact"}}),
    Case("sparse:seismic", "sparse", leg_params={"sparse": {"algorithm": "seismic"}}, exact=False),
    # hybrid over the three legs: every fusion method
    Case("hybrid:rrf", "hybrid", "rrf"),
    Case("hybrid:linear", "hybrid", "linear"),
    Case("hybrid:linear:zscore", "hybrid", "linear:zscore"),
    Case("hybrid:linear:none", "hybrid", "linear:none"),
    Case("hybrid:rrf:weighted", "hybrid", {"method": "rrf", "k": 20.0, "weights": WEIGHTS}),
    Case("hybrid:linear:weighted", "hybrid", {"method": "linear", "norm": "minmax", "weights": WEIGHTS}),
    Case("hybrid:rrf:depth20", "hybrid", "rrf", depth=20),
    Case("hybrid:linear:depth20", "hybrid", "linear", depth=20),
    Case("hybrid:rrf:maxscore+seismic", "hybrid", "rrf",
         leg_params={"bm25": {"algorithm": "maxscore"}, "sparse": {"algorithm": "seismic"}}, exact=False),
)


def layouts(n_docs: int) -> dict[str, int]:
    """Shard layouts: ``{"one": shard size of one shard (the default), "small": ...}``. The small
    size is ``n_docs // 3``: three full shards and a last one of ``n_docs % 3`` documents (fewer
    than k: 1 or 2 on these collections), which exercises merging across uneven shards."""
    from retriever.index.config import BuildConfig

    default = BuildConfig().shard_size
    if n_docs > default:
        raise ValueError(f"{n_docs} documents need more than one shard of the default size {default}")
    return {"one": default, "small": max(1, n_docs // 3)}


def judged_queries(collection: str) -> tuple[list[str], list[str]]:
    """``(query ids, texts)`` of the collection's queries that have qrels, in the queries file's order."""
    from retriever.index.readers import read_qrels, read_queries

    folder = DATA / collection
    queries = read_queries(folder / "queries.jsonl")
    qrels = read_qrels(folder / "qrels.tsv")
    qids = [q for q in queries if q in qrels]
    return qids, [queries[q] for q in qids]


def corpus(collection: str) -> Iterator[Any]:
    """The collection's documents (:class:`retriever.index.readers.Document`), in corpus order."""
    from retriever.index.readers import read_corpus

    return read_corpus(DATA / collection)


def doc_text(d: Any) -> str:
    """The text the build encodes and analyses for a document (``"title text"``, as ``build_index``)."""
    return f"{d.title} {d.text}" if d.title else d.text


def load_vectors(collection: str) -> dict[str, Any]:
    """The stored vectors of a collection.

    Returns:
        ``doc_ids`` (str, n), ``query_ids`` (str, nq), ``dense_docs`` float16 (n, dim),
        ``dense_queries`` float32 (nq, dim), ``sparse_docs`` and ``sparse_queries`` CSR triples
        ``(indptr int64 (rows+1,), terms int32 (nnz,), weights float32 (nnz,))``.

    Raises:
        FileNotFoundError: the vectors were not captured (run ``capture_golden``).
    """
    with np.load(VECTORS / f"{collection}.npz") as z:
        a = {k: z[k] for k in z.files}

    def csr(prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        indptr = np.zeros(len(a[f"{prefix}_nnz"]) + 1, np.int64)
        np.cumsum(a[f"{prefix}_nnz"], out=indptr[1:])
        return indptr, a[f"{prefix}_terms"].astype(np.int32), a[f"{prefix}_weights"].astype(np.float32)

    return {"doc_ids": a["doc_ids"], "query_ids": a["query_ids"], "dense_docs": a["dense_docs"],
            "dense_queries": a["dense_queries"], "sparse_docs": csr("sparse_docs"),
            "sparse_queries": csr("sparse_queries")}


def sparse_query_matrix(csr: tuple[np.ndarray, np.ndarray, np.ndarray], vocab_size: int) -> Any:
    """The query CSR triple as a ``scipy.sparse.csr_matrix`` (nq, vocab_size) for ``sparse_vectors=``."""
    import scipy.sparse

    indptr, terms, weights = csr
    return scipy.sparse.csr_matrix((weights, terms, indptr), shape=(len(indptr) - 1, vocab_size))


def build(collection: str, out: Path, shard_size: int, vectors: dict[str, Any]) -> dict[str, Any]:
    """Build the three-leg index of ``collection`` at ``out`` from the stored vectors.

    Raises:
        AssertionError: the corpus order does not match the stored vectors' document ids.
    """
    from retriever import build_index

    docs = list(corpus(collection))
    ids = np.array([d.id for d in docs])
    assert np.array_equal(ids, vectors["doc_ids"]), f"{collection}: corpus order differs from the stored vectors"
    return build_index(DATA / collection, out, legs=LEGS, shard_size=shard_size, show_progress=False,
                       dense_vectors=vectors["dense_docs"], sparse_vectors=vectors["sparse_docs"])


def result_arrays(retriever: Any, result: Any) -> dict[str, np.ndarray]:
    """A ``BatchResult`` as the arrays the golden files store (ids as document id strings)."""
    n_found = np.asarray(result.n_found, np.int32)
    ids = retriever.doc_ids(result.ids)
    ids = np.array(["" if x is None else x for x in ids.ravel().tolist()]).reshape(ids.shape)
    out = {"ids": ids, "scores": np.asarray(result.scores, np.float32), "n_found": n_found}
    for leg, la in result.legs.items():
        out[f"leg_scores:{leg}"] = np.asarray(la.scores, np.float32)
        out[f"leg_ranks:{leg}"] = np.asarray(la.ranks, np.int32)
    return out


def key(layout: str, case: str, field: str) -> str:
    """Array name in a golden file (``layout/case/field``, with ':' and '+' made file-name safe)."""
    return "/".join((layout, case, field)).replace(":", "~").replace("+", "_and_")


def load_golden(collection: str) -> dict[str, np.ndarray]:
    """The stored golden arrays of a collection (see :func:`key`)."""
    with np.load(GOLDEN / f"{collection}.npz") as z:
        return {k: z[k] for k in z.files}


def load_manifest() -> dict[str, Any]:
    """``golden/manifest.json``."""
    return json.loads(MANIFEST.read_text())


def differences(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> list[str]:
    """Names of the arrays that differ (fields missing on one side included), each with the first
    differing query. Scores compare bit for bit (float32 bit patterns; NaN, which marks a leg that
    did not return the hit, matches NaN)."""
    out = []
    for f in sorted(set(expected) | set(got)):
        if f not in expected or f not in got:
            out.append(f"{f}: only in {'golden' if f in expected else 'result'}")
            continue
        a, b = expected[f], got[f]
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{f}: shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
            continue
        if a.dtype == np.float32:  # bit for bit; any NaN (an absent leg) matches any NaN
            same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
        else:
            same = a == b
        if not same.all():
            rows = np.flatnonzero(~same.reshape(len(a), -1).all(axis=1)) if a.ndim > 1 else np.flatnonzero(~same)
            r = int(rows[0])
            out.append(f"{f}: {len(rows)} queries differ, first #{r}: golden {a[r].tolist()} vs {b[r].tolist()}")
    return out
