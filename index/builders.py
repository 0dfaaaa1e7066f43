"""The leg-builder protocol: what ``build_index`` needs from each leg's build side.

``build_index`` is reader → leg builders → writer (:mod:`retriever.index.pipeline`). For every
shard the pipeline hands each builder the shard's batches (:meth:`LegBuilder.add`), says when the
shard's last batch is in (:meth:`LegBuilder.end_shard`, where a builder may start background
work), has the writer write the shard's ``docs.arrow`` and then asks each builder to write its
files into the shard (:meth:`LegBuilder.finish_shard`), which returns the files, the leg's section
of the shard's ``stats.json`` and fields for the shard's manifest entry. After the last shard,
:meth:`LegBuilder.finish` writes index-level files (the BM25 vocabulary, the Matryoshka rotation,
the sparse index with the corpus-wide scale) and returns the leg's corpus statistics, build
information, model description and manifest fields; the pipeline assembles the manifest from
these in one place and the writer commits it.

A builder depends on nothing but its own state and the shard it is given, so one shard can be
built on its own (a later add to a living index, or a shard built on another machine), given the
index-wide state the builder keeps (the BM25 vocabulary, the Matryoshka rotation, the sparse scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from .readers import Document

if TYPE_CHECKING:
    from .config import BuildConfig


@dataclass(frozen=True)
class Batch:
    """Consecutive documents of one shard.

    Attributes:
        docs: the records, in corpus order.
        texts: what the text legs analyse / encode: ``"title text"`` (or the text alone when
            there is no title), one per document.
    """

    docs: Sequence[Document]
    texts: list[str]

    @property
    def first_id(self) -> str:
        """The first document's id (named in errors)."""
        return self.docs[0].id if self.docs else "?"


@dataclass(frozen=True)
class ShardHandle:
    """A shard being written: its number, directory (relative to the index root) and rows."""

    index: int
    dir: str
    rows: int


@dataclass
class ShardOutput:
    """What a builder wrote into one shard.

    Attributes:
        files: paths written (relative to the index root).
        stats: the leg's section of the shard's ``stats.json`` (None: none).
        entry: fields for the shard's manifest entry (e.g. ``n_terms``, ``nnz``).
    """

    files: list[str] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    entry: dict[str, Any] = field(default_factory=dict)


@dataclass
class IndexOutput:
    """What a builder contributes to the manifest after the last shard.

    Attributes:
        stats: corpus-wide statistics (manifest ``stats``).
        build: build information (manifest ``build``): truncation counts, model load and
            encoding seconds (``model_load_seconds``, ``encode_seconds``).
        model: the leg's model description (manifest ``models[leg]``), or None.
        config: build-config values fixed during the build (e.g. ``{"dtype": "float32"}`` for
            the dense section when float16 could not hold the vectors).
        extra: more top-level manifest fields (e.g. ``matryoshka``).
    """

    stats: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class LegBuilder(Protocol):
    """One leg's build side (BM25, dense, learned sparse)."""

    #: the leg's name: its ``stats.json`` section, ``models`` key and build-config section
    name: str

    def add(self, batch: Batch) -> None:
        """Take one batch of the current shard (analyse / encode it, or queue it)."""

    def end_shard(self) -> None:
        """The current shard's last batch was added (start background work for it)."""

    def finish_shard(self, writer: Any, shard: ShardHandle) -> ShardOutput:
        """Write the current shard's files through ``writer`` into ``shard``; ready for the next."""

    def finish(self, writer: Any, n_docs: int) -> IndexOutput:
        """After the last shard (``n_docs`` documents in all): write index-level files."""

    def close(self, *, raise_errors: bool = True) -> None:
        """Release threads and models (also on an error, with ``raise_errors=False``)."""


def manifest_parts(config: "BuildConfig", n_docs: int, outputs: Mapping[str, IndexOutput],
                    seconds: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Build config, corpus statistics, build information and extra manifest fields, assembled
    in one place from the builders' outputs (one-process and Ray builds alike)."""
    cfg = config.to_dict()
    stats: dict[str, Any] = {"n_docs": n_docs}
    build: dict[str, Any] = {"build_seconds": round(seconds, 3)}
    models: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    load_s, encode_s = 0.0, {}
    for leg, out in outputs.items():
        stats.update(out.stats)
        b = dict(out.build)
        load = b.pop("model_load_seconds", None)
        enc = b.pop("encode_seconds", None)
        if load is not None:
            load_s += load
        if enc is not None:
            encode_s[leg] = round(enc, 3)
        build.update(b)
        if out.model is not None:
            models[leg] = out.model
        cfg[leg].update(out.config)
        extra.update(out.extra)
    if encode_s:  # model loading (checkpoint + tokenizer + weight hashes) and time inside the encoders
        build["model_load_seconds"] = round(load_s, 3)
        build["encode_seconds"] = encode_s
    return cfg, stats, build, {"models": models, **extra}
