"""LlamaIndex adapter (extra ``retriever[llamaindex]``, llama-index-core >= 0.14).

- :class:`LlamaIndexRetriever`, a ``llama_index.core`` retriever over an opened index: every call
  is one :meth:`retriever.Retriever.search`, so its nodes, order and scores are the engine's own.
- :class:`LlamaIndexVectorStore`, a vector store over a living index, usable through
  ``VectorStoreIndex.from_vector_store(...)``: nodes' embeddings become the dense leg; queries run
  in LlamaIndex's default (dense), sparse and hybrid modes with ``MetadataFilters`` translated onto
  the engine's filter.

See docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Mapping

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.schema import (BaseNode, MetadataMode, NodeRelationship, NodeWithScore, QueryBundle,
                                         RelatedNodeInfo, TextNode)
    from llama_index.core.vector_stores.types import (BasePydanticVectorStore, FilterCondition, FilterOperator,
                                                      MetadataFilter, MetadataFilters, VectorStoreQuery,
                                                      VectorStoreQueryMode, VectorStoreQueryResult)
    from pydantic import PrivateAttr
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from ._common import missing_extra

    raise missing_extra("llama-index-core", "llamaindex", e) from e

from retriever.api import Retriever
from retriever.fusion import Linear
from retriever.index.config import BuildConfig
from retriever.index.errors import ConfigError, CorpusError, QueryError
from retriever.results import Hit

from ._common import SCORES_KEY, SearchOptions, check_retriever, hit_metadata
from ._store import IndexStore, make_record, unit_rows

__all__ = ["LlamaIndexRetriever", "LlamaIndexVectorStore", "hit_to_node", "translate_filters"]

#: LlamaIndex's default number of nodes per retrieval (``similarity_top_k``)
DEFAULT_TOP_K = 2


def hit_to_node(hit: Hit, mode: str, metadata_key: str = SCORES_KEY) -> NodeWithScore:
    """One :class:`~retriever.Hit` as a ``NodeWithScore``: ``node.id_`` = the document's ``_id``,
    ``node.text`` = its text, ``node.metadata`` = its metadata, its title (``"title"``, when not
    empty) and its scores under ``metadata_key``; ``score`` = the hit's score (fused in hybrid mode).
    The scores block is excluded from the text an LLM or an embedding model sees
    (``excluded_llm_metadata_keys`` / ``excluded_embed_metadata_keys``)."""
    node = TextNode(id_=hit.id, text=hit.text or "", metadata=hit_metadata(hit, mode, metadata_key),
                    excluded_llm_metadata_keys=[metadata_key], excluded_embed_metadata_keys=[metadata_key])
    return NodeWithScore(node=node, score=float(hit.score))


class LlamaIndexRetriever(BaseRetriever):
    """A LlamaIndex retriever over an opened :class:`retriever.Retriever`.

    Args:
        retriever: the opened index (``Retriever.open(path)``; or use :meth:`from_path`).
        similarity_top_k: nodes per retrieval (default 2, LlamaIndex's default).
        mode: ``"hybrid"`` (every leg the index has, fused by the engine), ``"bm25"``, ``"dense"``
            or ``"sparse"``.
        fusion: ``None``: the engine's default (the index's stored fusion, else RRF k = 40), a name (``"rrf"``, ``"linear"``, ...) or an
            :class:`~retriever.RRF` / :class:`~retriever.Linear` object.
        filter: ``None`` or a metadata filter (the dict form, e.g. ``{"lang": "en"}``).
        depth: candidates per leg before fusion (``None``: the engine's default).
        leg_params: per-leg search options, as :meth:`retriever.Retriever.search_arrays` takes.
        metadata_key: the node metadata key that holds the scores block
            ``{"score", "rank", "mode", "legs": {leg: {"score", "rank"}}}``.
        callback_manager, verbose: as LlamaIndex's ``BaseRetriever``.

    ``_retrieve`` searches the bundle's ``query_str`` with the index's own query encoders (a
    bundle's ``embedding`` is not used). ``_aretrieve`` runs the search in a worker thread.

    Raises:
        QueryError: ``retriever`` is not an open Retriever; bad options at retrieval time.
    """

    def __init__(self, retriever: Retriever, *, similarity_top_k: int = DEFAULT_TOP_K, mode: str = "hybrid",
                 fusion: Any = None, filter: Any = None, depth: int | None = None,
                 leg_params: Mapping[str, Any] | None = None, metadata_key: str = SCORES_KEY,
                 callback_manager: CallbackManager | None = None, verbose: bool = False) -> None:
        self.retriever = check_retriever(retriever)
        self.options = SearchOptions(k=similarity_top_k, mode=mode, fusion=fusion, filter=filter, depth=depth,
                                     leg_params=leg_params)
        self.metadata_key = metadata_key
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> "LlamaIndexRetriever":
        """Open the index at ``path`` (:meth:`retriever.Retriever.open` with its defaults) and wrap it."""
        return cls(Retriever.open(path), **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = self.options.search(check_retriever(self.retriever), query_bundle.query_str)
        return [hit_to_node(h, self.options.mode, self.metadata_key) for h in hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


#: the metadata field that holds a node's source document id (``node.ref_doc_id``)
REF_DOC_KEY = "ref_doc_id"

#: LlamaIndex filter operators and their dict-form operators (the others are errors)
_OPERATORS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt",
              FilterOperator.GTE: "$gte", FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte",
              FilterOperator.IN: "$in", FilterOperator.NIN: "$nin"}


def translate_filters(filters: MetadataFilters | None) -> dict[str, Any] | None:
    """LlamaIndex ``MetadataFilters`` as the engine's dict filter.

    ``==, !=, >, >=, <, <=, in, nin`` map onto ``$eq, $ne, $gt, $gte, $lt, $lte, $in, $nin``;
    ``is_empty`` onto ``{"$exists": False}``; on ``list<string>`` fields ``contains`` (the list holds
    the value) onto ``{field: value}``, ``any`` onto ``$in`` and ``all`` onto one ``$and`` of
    ``contains``. Conditions ``and`` / ``or`` / ``not`` (not of the AND of the filters) map onto
    ``$and`` / ``$or`` / ``$not``; nested ``MetadataFilters`` nest. A field that a document lacks
    fails every comparison (SQL's null semantics, as the engine's filters), ``!=`` included.

    Raises:
        QueryError: ``text_match`` / ``text_match_insensitive`` (no text matching in filters) or an
            unknown operator or condition (names it).
    """
    if filters is None:
        return None
    parts: list[dict[str, Any]] = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            sub = translate_filters(f)
            if sub is not None:
                parts.append(sub)
            continue
        op = FilterOperator(f.operator)
        if op in _OPERATORS:
            parts.append({f.key: {_OPERATORS[op]: f.value}})
        elif op == FilterOperator.IS_EMPTY:
            parts.append({f.key: {"$exists": False}})
        elif op == FilterOperator.CONTAINS:
            parts.append({f.key: f.value})
        elif op == FilterOperator.ANY:
            parts.append({f.key: {"$in": list(f.value) if isinstance(f.value, list) else [f.value]}})
        elif op == FilterOperator.ALL:
            values = f.value if isinstance(f.value, list) else [f.value]
            parts.append({"$and": [{f.key: v} for v in values]})
        else:
            raise QueryError(f"MetadataFilter on {f.key!r}: operator {op.value!r} is not supported; expected one "
                             f"of {', '.join(o.value for o in (*_OPERATORS, FilterOperator.IS_EMPTY, FilterOperator.CONTAINS, FilterOperator.ANY, FilterOperator.ALL))}")
    condition = FilterCondition(filters.condition or FilterCondition.AND)
    if condition == FilterCondition.AND:
        return {"$and": parts} if parts else {}
    if condition == FilterCondition.OR:
        return {"$or": parts} if parts else {}
    if condition == FilterCondition.NOT:
        return {"$not": {"$and": parts}}
    raise QueryError(f"MetadataFilters: unknown condition {condition!r}")  # pragma: no cover


class LlamaIndexVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over a living index (``stores_text``: nodes' texts and metadata
    live in the index; no docstore needed).

    Build one and hand it to ``VectorStoreIndex.from_vector_store(store, embed_model=...)`` (or
    ``VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store))``).

    Args:
        path: the index directory: an existing index, or where the first ``add`` creates one.
        external_vectors: True (default): the nodes' embeddings (from LlamaIndex's embed model) are
            the dense leg's vectors and the query's embedding its query. False: the index's own
            models encode texts and queries (nodes' embeddings are ignored).
        sparse_leg: the leg LlamaIndex's ``sparse`` mode runs: ``"bm25"`` (default) or
            ``"sparse"`` (learned sparse; the index must have been built with it).
        fusion: fusion of the ``hybrid`` mode (``None``: the engine's default, the index's stored fusion or RRF k = 40); a query's ``alpha`` instead
            fuses linearly (min-max) with weight ``alpha`` on the dense leg and ``1 - alpha`` on each
            other leg.
        normalize: L2-normalise the embeddings (the dense leg's inner product is then cosine).
        config: build configuration of a new index (default ``legs=("bm25", "dense")``).
        open_options, updater_options: keyword arguments of :meth:`retriever.Retriever.open` and
            :meth:`retriever.IndexUpdater.open`.

    Query modes (``VectorStoreQuery.mode``; any other mode is a :class:`~retriever.QueryError`,
    never a silent fallback):

    - ``default``: the dense leg alone, ``similarity_top_k`` nodes.
    - ``sparse``: ``sparse_leg`` alone, ``sparse_top_k`` nodes (``similarity_top_k`` when unset).
    - ``hybrid``: every leg, fused by the engine; ``hybrid_top_k`` nodes (``similarity_top_k`` when
      unset). Each leg contributes its top ``depth`` candidates, one depth for every leg: the
      larger of ``similarity_top_k`` and ``sparse_top_k`` when ``sparse_top_k`` is set, else the
      engine's default (100).

    ``filters`` are translated with :func:`translate_filters`; ``doc_ids`` restricts to nodes of
    those source documents; ``node_ids`` and ``mmr_threshold`` are errors.
    Similarities are the engine's scores (fused in hybrid mode). Node ids are our ``_id``; a
    node's ``ref_doc_id`` is stored as the metadata field ``ref_doc_id`` (the key of
    :meth:`delete`).
    """

    stores_text: bool = True
    is_embedding_query: bool = True
    flat_metadata: bool = False
    sparse_leg: str = "bm25"

    _store: IndexStore = PrivateAttr()
    _fusion: Any = PrivateAttr(default=None)

    def __init__(self, path: str | Path, *, external_vectors: bool = True, sparse_leg: str = "bm25",
                 fusion: Any = None, normalize: bool = True, config: BuildConfig | None = None,
                 open_options: dict[str, Any] | None = None, updater_options: dict[str, Any] | None = None) -> None:
        if sparse_leg not in ("bm25", "sparse"):
            raise ConfigError(f"sparse_leg must be 'bm25' or 'sparse', got {sparse_leg!r}")
        super().__init__(sparse_leg=sparse_leg, is_embedding_query=external_vectors)
        self._store = IndexStore(path, external_vectors=external_vectors, normalize=normalize, config=config,
                                 open_options=open_options, updater_options=updater_options)
        self._fusion = fusion

    @classmethod
    def class_name(cls) -> str:
        return "RetrieverVectorStore"

    @property
    def client(self) -> Retriever | None:
        """The store's :class:`~retriever.Retriever` (``None`` before the first add)."""
        return self._store.retriever

    @property
    def store(self) -> IndexStore:
        """The framework-free store core."""
        return self._store

    def close(self) -> None:
        """Release the index's writer lock and close the reader."""
        self._store.close()

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Add (or replace, by node id) nodes; one commit.

        Returns:
            the node ids.

        Raises:
            ConfigError: a node without an embedding while the store takes external vectors.
            CorpusError: a reserved metadata key (``_id``, ``text``, a ``ref_doc_id`` other than the
                node's), a node id twice, metadata of another type than the index's field.
        """
        nodes = list(nodes)
        if not nodes:
            return []
        records = []
        for n in nodes:
            meta = dict(n.metadata)
            ref = n.ref_doc_id
            if REF_DOC_KEY in meta and meta[REF_DOC_KEY] != ref:
                raise CorpusError(f"node {n.node_id!r}: metadata key {REF_DOC_KEY!r} is reserved (the node's "
                                  f"ref_doc_id)", field=REF_DOC_KEY)
            meta.pop(REF_DOC_KEY, None)
            if ref is not None:
                meta[REF_DOC_KEY] = ref
            records.append(make_record(n.node_id, n.get_content(metadata_mode=MetadataMode.NONE), meta))
        vectors = None
        if self._store.external_vectors and self._store.has_dense:
            missing = [n.node_id for n in nodes if n.embedding is None]
            if missing:
                raise ConfigError(f"node {missing[0]!r} has no embedding (this store stores the embed model's "
                                  f"vectors; give VectorStoreIndex an embed_model)")
            vectors = unit_rows([n.embedding for n in nodes], len(nodes), normalize=self._store.normalize)
        self._store.upsert(records, vectors)
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the source document ``ref_doc_id`` (one commit; none: no-op)."""
        if not self._store.has_field(REF_DOC_KEY):  # no stored node has a source document
            return
        ids = self._store.ids_where({REF_DOC_KEY: ref_doc_id})
        if ids:
            self._store.delete(ids)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete nodes by id and / or by filters (both: the nodes matching both)."""
        ids = self._select_ids(node_ids, filters)
        if ids:
            self._store.delete(ids)

    def clear(self) -> None:
        """Delete every node."""
        ids = self._store.live_ids()
        if ids:
            self._store.delete(ids)

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                  **kwargs: Any) -> list[BaseNode]:
        """Stored nodes by id and / or filters (in the order of ``node_ids`` when given)."""
        ids = self._select_ids(node_ids, filters)
        return [self._node(d["id"], d["text"], d["title"], d["metadata"]) for d in self._store.get(ids)]

    def _select_ids(self, node_ids: list[str] | None, filters: MetadataFilters | None) -> list[str]:
        if filters is None:
            return list(node_ids) if node_ids is not None else self._store.live_ids()
        passing = self._store.ids_where(translate_filters(filters))
        if node_ids is None:
            return passing
        ok = set(passing)
        return [i for i in node_ids if i in ok]

    # ------------------------------------------------------------------ reads
    @staticmethod
    def _node(doc_id: str, text: str | None, title: str | None, metadata: Mapping[str, Any]) -> TextNode:
        meta = dict(metadata)
        ref = meta.pop(REF_DOC_KEY, None)
        if title:
            meta["title"] = title
        rel = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref)} if ref is not None else {}
        return TextNode(id_=doc_id, text=text or "", metadata=meta, relationships=rel)

    def _options(self, query: VectorStoreQuery) -> SearchOptions:
        mode = VectorStoreQueryMode(query.mode)
        flt = translate_filters(query.filters)
        restrict: list[dict[str, Any]] = []
        if query.doc_ids:
            restrict.append({REF_DOC_KEY: {"$in": list(query.doc_ids)}})
        if query.node_ids:
            raise QueryError("node_ids in a query are not supported (filter on metadata or doc_ids instead)")
        if restrict:
            flt = {"$and": ([flt] if flt else []) + restrict}
        if query.mmr_threshold is not None:
            raise QueryError("mmr_threshold is not supported (no MMR re-ranking in this store)")
        if mode == VectorStoreQueryMode.DEFAULT:
            if query.alpha is not None:
                raise QueryError("alpha applies to the hybrid mode only")
            return SearchOptions(k=query.similarity_top_k, mode="dense", filter=flt)
        if mode == VectorStoreQueryMode.SPARSE:
            if self.sparse_leg not in self._store.legs:
                raise QueryError(f"sparse mode runs the {self.sparse_leg!r} leg, which this index does not have "
                                 f"(legs: {', '.join(self._store.legs)})")
            return SearchOptions(k=query.sparse_top_k or query.similarity_top_k, mode=self.sparse_leg, filter=flt)
        if mode == VectorStoreQueryMode.HYBRID:
            fusion = self._fusion
            if query.alpha is not None:
                if not 0.0 <= query.alpha <= 1.0:
                    raise QueryError(f"alpha must be in [0, 1], got {query.alpha!r}")
                fusion = Linear(weights={leg: (query.alpha if leg == "dense" else 1.0 - query.alpha)
                                         for leg in self._store.legs})
            depth = None
            if query.sparse_top_k is not None:
                depth = max(query.similarity_top_k, query.sparse_top_k)
            return SearchOptions(k=query.hybrid_top_k or query.similarity_top_k, mode="hybrid", fusion=fusion,
                                 depth=depth, filter=flt)
        raise QueryError(f"query mode {mode.value!r} is not supported; expected default, sparse or hybrid")

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Run a ``VectorStoreQuery`` (modes and options: see the class).

        Raises:
            QueryError: an unsupported mode, operator or option; a dense search without a query
                embedding (external vectors).
        """
        opts = self._options(query)
        if query.doc_ids and not self._store.has_field(REF_DOC_KEY):  # no node has a source document
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        text = query.query_str or ""
        vector = query.query_embedding if opts.mode in ("dense", "hybrid") else None
        hits, _ = self._store.search(text, opts, vector)
        nodes = [self._node(h.id, h.text, h.title, h.metadata) for h in hits]
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.score) for h in hits],
                                      ids=[h.id for h in hits])
