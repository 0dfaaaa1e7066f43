"""LangChain adapter (extra ``retriever[langchain]``, langchain-core >= 1.0).

:class:`LangChainRetriever` is a ``langchain_core.retrievers.BaseRetriever`` over an opened index:
every call is one :meth:`retriever.Retriever.search`, so its documents, order and scores are the
engine's own. See docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, field_validator
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from ._common import missing_extra

    raise missing_extra("langchain-core", "langchain", e) from e

from retriever.api import Retriever
from retriever.results import Hit

from ._common import SCORES_KEY, SearchOptions, check_retriever, hit_metadata

__all__ = ["LangChainRetriever", "hit_to_document"]


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
        fusion: ``None`` (RRF, k = 60), a name (``"rrf"``, ``"linear"``, ``"linear:zscore"``...) or
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
