"""LangChain adapter (extra ``retriever[langchain]``, langchain-core >= 1.0).

- :class:`LangChainRetriever`, a ``langchain_core.retrievers.BaseRetriever`` over an opened index:
  every call is one :meth:`retriever.Retriever.search`, so its documents, order and scores are the
  engine's own.
- :class:`LangChainVectorStore`, a ``langchain_core.vectorstores.VectorStore`` over a living index
  (created on the first add, changed through :class:`retriever.IndexUpdater`): the dense leg's
  vectors come from a LangChain ``Embeddings`` object or from the index's own model; BM25 (and
  learned sparse, where built) are fused with it by the engine.

See docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore
    from pydantic import ConfigDict, field_validator
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from ._common import missing_extra

    raise missing_extra("langchain-core", "langchain", e) from e

from retriever.api import Retriever
from retriever.index.config import BuildConfig
from retriever.index.errors import ConfigError, CorpusError, QueryError
from retriever.results import Hit

from ._common import SCORES_KEY, SearchOptions, check_retriever, hit_metadata
from ._store import IndexStore, make_record, new_id, relevance, stored_metadata, unit_rows

__all__ = ["LangChainRetriever", "LangChainVectorStore", "hit_to_document"]


def hit_to_document(hit: Hit, mode: str, metadata_key: str = SCORES_KEY) -> Document:
    """One :class:`~retriever.Hit` as a LangChain ``Document``: ``id`` = the document's ``_id``,
    ``page_content`` = its text, ``metadata`` = its metadata, its title (``"title"``, when not
    empty) and its scores under ``metadata_key`` (see :func:`retriever.integrations._common.scores_block`)."""
    return Document(page_content=hit.text or "", metadata=hit_metadata(hit, mode, metadata_key), id=hit.id)


class LangChainRetriever(BaseRetriever):
    """A LangChain retriever over an opened :class:`retriever.Retriever`.

    Every field below except ``retriever`` and ``metadata_key`` can also be given per call:
    ``lc.invoke("question", k=3, filter={"lang": "en"})``; an unknown keyword is a
    :class:`~retriever.QueryError` naming it.

    Attributes:
        retriever: the opened index (``Retriever.open(path)``; or use :meth:`from_path`).
        k: documents per call (default 4, LangChain's usual default).
        mode: ``"hybrid"`` (every leg the index has, fused by the engine), ``"bm25"``, ``"dense"``
            or ``"sparse"``.
        fusion: ``None``: the engine's default (the index's stored fusion, else RRF k = 40), a name (``"rrf"``, ``"linear"``, ``"linear:zscore"``...) or
            an :class:`~retriever.RRF` / :class:`~retriever.Linear` object.
        filter: ``None`` or a metadata filter (the dict form, e.g. ``{"year": {"$gte": 2020}}``).
        depth: candidates per leg before fusion (``None``: the engine's default, 100).
        leg_params: per-leg search options, as :meth:`retriever.Retriever.search_arrays` takes.
        metadata_key: the metadata key that holds each document's scores:
            ``{"score": fused, "rank": 1-based, "mode": mode, "legs": {leg: {"score", "rank"}}}``.

    Each returned ``Document`` has ``id`` = the document's ``_id``, ``page_content`` = its text and
    ``metadata`` = its stored metadata, its title (``"title"``) and the scores block. The async
    methods run the search in a worker thread (the compiled kernels release the GIL).

    Raises (at search time):
        QueryError: bad k, mode, fusion, filter or an unknown per-call option.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    k: int = 4
    mode: str = "hybrid"
    fusion: Any = None
    filter: Any = None
    depth: int | None = None
    leg_params: dict[str, Any] | None = None
    metadata_key: str = SCORES_KEY

    @field_validator("retriever")
    @classmethod
    def _check_retriever(cls, value: Any) -> Retriever:
        return check_retriever(value)

    @classmethod
    def from_path(cls, path: str | Path, **fields: Any) -> "LangChainRetriever":
        """Open the index at ``path`` (:meth:`retriever.Retriever.open` with its defaults) and wrap it;
        ``fields`` are this class's other fields."""
        return cls(retriever=Retriever.open(path), **fields)

    def options(self, **overrides: Any) -> SearchOptions:
        """This retriever's search options with per-call ``overrides`` applied."""
        base = SearchOptions(k=self.k, mode=self.mode, fusion=self.fusion, filter=self.filter, depth=self.depth,
                             leg_params=self.leg_params)
        return base.override(overrides, ignore=("verbose",))

    def search_hits(self, query: str, **overrides: Any) -> list[Hit]:
        """The engine's hits for ``query`` with this retriever's options (and ``overrides``)."""
        return self.options(**overrides).search(check_retriever(self.retriever), query)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        opts = self.options(**kwargs)
        hits = opts.search(check_retriever(self.retriever), query)
        return [hit_to_document(h, opts.mode, self.metadata_key) for h in hits]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        opts = self.options(**kwargs)
        hits = await asyncio.to_thread(opts.search, check_retriever(self.retriever), query)
        return [hit_to_document(h, opts.mode, self.metadata_key) for h in hits]


#: search keywords the vector store's search methods take besides ``k`` and ``filter``
_STORE_OPTIONS = ("mode", "fusion", "depth", "leg_params")


class LangChainVectorStore(VectorStore):
    """A LangChain vector store over a living index (hybrid: BM25, dense and, where built, learned
    sparse, fused by the engine).

    Args:
        path: the index directory: an existing index, or where the first add creates one (an
            index cannot be empty; until the first add every search returns nothing).
        embedding: a LangChain ``Embeddings`` for the dense leg: documents' vectors are computed
            through it and stored (the index records its dense model as ``"precomputed"``), queries
            are embedded with ``embed_query``. ``None``: the index's own models encode documents
            and queries (the bundled MiniLM for a new index).
        mode: default search mode: ``"hybrid"`` (every leg the index has), ``"bm25"``,
            ``"dense"`` or ``"sparse"``.
        fusion: default fusion of the hybrid mode (``None``: the engine's default, the index's stored fusion or RRF k = 40; a name or an
            :class:`~retriever.RRF` / :class:`~retriever.Linear`).
        depth, leg_params: default search options, as :meth:`retriever.Retriever.search_arrays`.
        normalize: L2-normalise the embedding model's vectors (the dense leg's inner product is
            then cosine similarity, and its relevance (1 + cos) / 2).
        config: build configuration of a new index (default ``legs=("bm25", "dense")``, vectors
            from ``embedding`` stored as float32); e.g. ``BuildConfig(legs=("bm25", "dense",
            "sparse"))`` adds a learned-sparse leg encoded by the index's SPLADE model.
        scores_key: when set, returned documents carry their scores block (fused score, rank and
            per-leg scores and ranks) under this metadata key; default ``None`` (documents hold only
            their own metadata, as LangChain's vector stores return them).
        open_options, updater_options: keyword arguments of :meth:`retriever.Retriever.open` and
            :meth:`retriever.IndexUpdater.open`.

    Documents map onto records as: ``id`` ↔ ``_id`` (generated, a UUID4 hex, when missing),
    ``page_content`` ↔ ``text``, metadata ``"title"`` (a string) ↔ the record's title (indexed with
    the text), other metadata ↔ typed metadata fields (filterable with ``filter=``). Adding a
    document whose id exists replaces it (an upsert, as LangChain's stores do). Every
    ``add_*`` / ``delete`` call is one atomic commit, after which this store searches the new
    generation; the store is the index's one writer from its first write to :meth:`close`.

    Search methods take ``k``, ``filter`` (the dict form) and the keywords ``mode``, ``fusion``,
    ``depth``, ``leg_params``; another keyword is a :class:`~retriever.QueryError` naming it. Async
    methods are LangChain's defaults: the sync method in a worker thread.

    Raises:
        ConfigError: an existing index whose dense vectors do not match ``embedding`` (precomputed
            vs the index's own model).
    """

    def __init__(self, path: str | Path, embedding: Embeddings | None = None, *, mode: str = "hybrid",
                 fusion: Any = None, depth: int | None = None, leg_params: dict[str, Any] | None = None,
                 normalize: bool = True, config: BuildConfig | None = None, scores_key: str | None = None,
                 open_options: dict[str, Any] | None = None, updater_options: dict[str, Any] | None = None) -> None:
        if embedding is not None and not isinstance(embedding, Embeddings):
            raise ConfigError(f"embedding must be a langchain_core Embeddings or None, got {type(embedding).__name__}")
        self._embedding = embedding
        self.defaults = SearchOptions(k=4, mode=mode, fusion=fusion, depth=depth, leg_params=leg_params)
        self.scores_key = scores_key
        self.store = IndexStore(path, external_vectors=embedding is not None, normalize=normalize, config=config,
                                open_options=open_options, updater_options=updater_options)

    # ------------------------------------------------------------------ lifecycle
    @property
    def embeddings(self) -> Embeddings | None:
        """The embedding model of the dense leg (``None``: the index's own models)."""
        return self._embedding

    @property
    def retriever(self) -> Retriever | None:
        """The store's :class:`~retriever.Retriever` (``None`` before the first add)."""
        return self.store.retriever

    def close(self) -> None:
        """Release the index's writer lock and close the reader."""
        self.store.close()

    def __enter__(self) -> "LangChainVectorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writes
    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: list[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Add (or replace, by id) texts; one commit.

        Args:
            texts: the documents' texts.
            metadatas: one metadata dict per text (not modified).
            ids: one id per text; ``None`` (or a ``None`` entry) generates one.

        Returns:
            the documents' ids, in order.

        Raises:
            CorpusError: lengths that differ, an id twice in the batch (names both positions), a
                reserved metadata key (``_id``, ``text``), metadata of another type than the
                index's field. Nothing is written then.
        """
        if kwargs:
            raise QueryError(f"add_texts: unknown keyword {sorted(kwargs)[0]!r}")
        texts = list(texts)
        metas = list(metadatas) if metadatas is not None else [{}] * len(texts)
        given = list(ids) if ids is not None else [None] * len(texts)
        if len(metas) != len(texts) or len(given) != len(texts):
            raise CorpusError(f"add_texts: {len(texts)} texts, {len(metas)} metadatas and {len(given)} ids "
                              f"(one of each per text)")
        out = [i if i is not None else new_id() for i in given]
        records = [make_record(i, t, m) for i, t, m in zip(out, texts, metas)]
        vectors = None
        if self._embedding is not None and records:
            vectors = unit_rows(self._embedding.embed_documents(texts), len(texts), normalize=self.store.normalize)
        self.store.upsert(records, vectors)
        return out

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete documents by id (ids that name no document are ignored, as LangChain expects);
        ``None`` deletes every document. One commit.

        Returns:
            True.

        Raises:
            ConfigError: ``ids`` is one string (a list is meant), or the store is closed.
        """
        if kwargs:
            raise QueryError(f"delete: unknown keyword {sorted(kwargs)[0]!r}")
        self.last_delete = self.store.delete(self.store.live_ids() if ids is None else
                                             ids if isinstance(ids, (str, bytes)) else list(ids))
        return True

    # ------------------------------------------------------------------ reads
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents with these ids (in the order asked; unknown ids left out)."""
        return [Document(page_content=d["text"], metadata=stored_metadata(d), id=d["id"])
                for d in self.store.get(list(ids))]

    def _options(self, k: int, filter: Any, kwargs: dict[str, Any]) -> SearchOptions:
        unknown = sorted(set(kwargs) - set(_STORE_OPTIONS))
        if unknown:
            raise QueryError(f"unknown search option {unknown[0]!r}; expected k, filter or one of "
                             f"{', '.join(_STORE_OPTIONS)}")
        return self.defaults.override({"k": k, "filter": filter, **kwargs})

    def _document(self, hit: Hit, mode: str) -> Document:
        meta = dict(hit.metadata)
        if hit.title:
            meta["title"] = hit.title
        if self.scores_key is not None:
            meta = hit_metadata(hit, mode, self.scores_key)
        return Document(page_content=hit.text or "", metadata=meta, id=hit.id)

    def _run(self, query: str, opts: SearchOptions, vector: Any = None) -> list[tuple[Document, float, float]]:
        if vector is None and self._embedding is not None and opts.mode in ("hybrid", "dense") \
                and self.store.has_dense and self.store.retriever is not None:
            vector = self._embedding.embed_query(query)
        hits, res = self.store.search(query, opts, vector)
        return [(self._document(h, opts.mode), float(h.score), relevance(float(h.score), opts.mode, res))
                for h in hits] if res is not None else []

    def similarity_search(self, query: str, k: int = 4, filter: Any = None, **kwargs: Any) -> list[Document]:
        """The ``k`` best documents for ``query`` (the engine's order)."""
        return [d for d, _, _ in self._run(query, self._options(k, filter, kwargs))]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Any = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """``(document, score)`` pairs, best first: the engine's score (fused in hybrid mode, else
        the leg's raw score; higher is better)."""
        return [(d, s) for d, s, _ in self._run(query, self._options(k, filter, kwargs))]

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                 **kwargs: Any) -> list[tuple[Document, float]]:
        """``(document, relevance)`` pairs, relevance in [0, 1] (higher is better; the mapping of
        each mode's score: :func:`retriever.integrations._store.relevance`)."""
        filter = kwargs.pop("filter", None)
        return [(d, r) for d, _, r in self._run(query, self._options(k, filter, kwargs))]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                    **kwargs: Any) -> list[Document]:
        """The ``k`` documents nearest to a query vector (the dense leg alone).

        Raises:
            QueryError: the index has no dense leg, or its vectors are the index model's own
                (a vector from elsewhere is not comparable; search by text).
        """
        return [d for d, _ in self.similarity_search_with_score_by_vector(embedding, k, filter, **kwargs)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """``(document, inner product)`` pairs for a query vector (the dense leg alone; the vector
        is normalised like the documents')."""
        if not self.store.has_dense:
            raise QueryError("similarity_search_by_vector: this index has no dense leg")
        if self._embedding is None:
            raise QueryError("similarity_search_by_vector: this index's vectors come from its own model; "
                             "search by text")
        if kwargs.get("mode", "dense") != "dense":
            raise QueryError(f"similarity_search_by_vector runs the dense leg alone, not mode {kwargs['mode']!r}")
        opts = self._options(k, filter, {**kwargs, "mode": "dense"})
        return [(d, s) for d, s, _ in self._run("", opts, embedding)]

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None, metadatas: list[dict] | None = None,
                   *, ids: list[str] | None = None, path: str | Path | None = None,
                   **kwargs: Any) -> "LangChainVectorStore":
        """A store at ``path`` (required) holding ``texts``; ``kwargs`` are the constructor's."""
        if path is None:
            raise ConfigError("LangChainVectorStore.from_texts needs path= (the index directory)")
        store = cls(path, embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store
