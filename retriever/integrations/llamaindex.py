"""LlamaIndex adapter (extra ``retriever[llamaindex]``, llama-index-core >= 0.14).

:class:`LlamaIndexRetriever` is a ``llama_index.core`` retriever over an opened index: every call is
one :meth:`retriever.Retriever.search`, so its nodes, order and scores are the engine's own. See
docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from ._common import missing_extra

    raise missing_extra("llama-index-core", "llamaindex", e) from e

from retriever.api import Retriever
from retriever.results import Hit

from ._common import SCORES_KEY, SearchOptions, check_retriever, hit_metadata

__all__ = ["LlamaIndexRetriever", "hit_to_node"]

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
        fusion: ``None`` (RRF, k = 60), a name (``"rrf"``, ``"linear"``, ...) or an
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
