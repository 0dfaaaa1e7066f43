"""Framework-free parts of the adapters: search options, one search call and the metadata block
that carries a hit's fused and per-leg scores into a framework's document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from retriever.index.errors import QueryError

if TYPE_CHECKING:
    from retriever.api import Retriever
    from retriever.results import Hit

#: default metadata key under which a hit's scores travel (``metadata[SCORES_KEY]``)
SCORES_KEY = "retriever"
#: search options an adapter takes as fields and per call
OPTION_NAMES = ("k", "mode", "fusion", "filter", "depth", "leg_params")


def missing_extra(framework: str, extra: str, error: ImportError) -> ImportError:
    """The ``ImportError`` an adapter module raises when its framework is not installed."""
    return ImportError(f"retriever.integrations.{extra} needs {framework}: pip install 'retriever[{extra}]' "
                       f"({error})")


@dataclass(frozen=True)
class SearchOptions:
    """The options of one adapter search, handed to :meth:`retriever.Retriever.search` as they are.

    Attributes:
        k: hits to return (>= 1).
        mode: ``"hybrid"``, ``"bm25"``, ``"dense"`` or ``"sparse"``.
        fusion: ``None`` (the engine's default: the index's stored fusion, else RRF k = 40), a name such as ``"rrf"`` or
            ``"linear:zscore"``, or an :class:`~retriever.RRF` / :class:`~retriever.Linear` object.
        filter: ``None`` or a metadata filter in the dict form (``{"year": {"$gte": 2020}}``) or a
            ``pyarrow.compute`` expression.
        depth: candidates per leg before fusion (``None``: the engine's default).
        leg_params: per-leg search options (see :meth:`retriever.Retriever.search_arrays`).
    """

    k: int
    mode: str = "hybrid"
    fusion: Any = None
    filter: Any = None
    depth: int | None = None
    leg_params: Mapping[str, Any] | None = None

    def override(self, overrides: Mapping[str, Any], *, ignore: tuple[str, ...] = ()) -> "SearchOptions":
        """These options with the per-call ``overrides`` applied.

        Raises:
            QueryError: an override that is not a search option (names it and the valid ones).
        """
        unknown = sorted(set(overrides) - set(OPTION_NAMES) - set(ignore))
        if unknown:
            raise QueryError(f"unknown search option {unknown[0]!r}; expected some of {', '.join(OPTION_NAMES)}")
        given = {name: value for name, value in overrides.items() if name in OPTION_NAMES}
        return replace(self, **given) if given else self

    def search(self, retriever: "Retriever", query: str) -> "list[Hit]":
        """Run :meth:`retriever.Retriever.search` with these options."""
        return retriever.search(query, self.k, mode=self.mode, fusion=self.fusion, depth=self.depth,
                                leg_params=self.leg_params, filter=self.filter)


def check_retriever(obj: Any) -> "Retriever":
    """``obj`` when it is an open :class:`retriever.Retriever`.

    Raises:
        QueryError: another type, or a closed Retriever.
    """
    from retriever.api import Retriever

    if not isinstance(obj, Retriever):
        raise QueryError(f"retriever must be a retriever.Retriever (Retriever.open(path)), got {type(obj).__name__}")
    if obj.engine is None:
        raise QueryError("this Retriever is closed")
    return obj


def scores_block(hit: "Hit", mode: str) -> dict[str, Any]:
    """A hit's scores as plain JSON-able values: ``{"score", "rank", "mode", "legs": {leg:
    {"score", "rank"}}}`` (``score`` is the fused score in hybrid mode, else the leg's raw score;
    ``legs`` holds the legs that returned the document, with their raw scores and 1-based
    tie-shared ranks)."""
    return {"score": float(hit.score), "rank": int(hit.rank), "mode": mode,
            "legs": {leg: {"score": float(lh.score), "rank": int(lh.rank)} for leg, lh in hit.legs.items()}}


def hit_metadata(hit: "Hit", mode: str, key: str = SCORES_KEY) -> dict[str, Any]:
    """A framework document's metadata for ``hit``: the document's own metadata, its title (under
    ``"title"``, when not empty) and :func:`scores_block` under ``key``.

    Raises:
        QueryError: the document's metadata already holds ``key`` or a non-empty title next to a
            ``"title"`` field (names the document; choose another ``metadata_key``).
    """
    meta = dict(hit.metadata)
    if hit.title:
        if "title" in meta:
            raise QueryError(f"document {hit.id!r} has both a title and a metadata field 'title'")
        meta["title"] = hit.title
    if key in meta:
        raise QueryError(f"document {hit.id!r} has a metadata field {key!r}, the key the scores go under; "
                         f"pass another metadata_key")
    meta[key] = scores_block(hit, mode)
    return meta
