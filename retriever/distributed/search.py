"""Scatter-gather search on Ray actors, with corpus-wide statistics: results equal one process's.

Layout (see docs/DISTRIBUTED.md)::

    driver (Retriever.open(path, executor=RayExecutor(...)))
      reader: the manifest, mmapped docs (fetches), zero-shard legs (query encoders, analyzer)
      open:   actors created, each opening its shards  ──► held_stats()   (per-shard N, df, sum dl)
              CorpusStats.combine(...) once, ray.put once ──► load(stats)  (legs built with them)
      query:  per leg: prepare once on the driver (dense / sparse encoders: vectors shipped) or on
              the actors (BM25: the text shipped, analysed where the postings are)
              ──► search(leg, prepared, depth, threads, allow)  every actor, in parallel
              ◄── each actor's top-depth over its shards (global ordinals)
              merge_topk over actors, then the engine fuses once (Engine.search, unchanged)

Each actor runs :class:`ShardSearcher`: an :class:`~retriever.shards.IndexReader` of the driver's
generation (memory-mapped, so the index path must be readable from every node) and an
:class:`~retriever.engine.Engine` over its shards with the whole index's statistics, which is what
makes a shard's scores independent of where it is searched. The driver's :class:`DistributedEngine`
is an :class:`~retriever.engine.Engine` whose legs are :class:`RemoteLeg` objects, so the whole
query path (blank queries, leg scheduling, fusion, timings) is the one-process code.

Failures: an actor that dies is restarted by Ray up to ``RayExecutor.max_restarts`` times and its
pending calls are retried (the restarted actor reopens its shards and fetches the statistics again
from the object store); when that is exhausted the search raises
:class:`~retriever.index.errors.DistributedError` naming the actor's shards. An error raised by a
leg on an actor (e.g. a :class:`~retriever.index.errors.QueryError`) is raised again as itself.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import ray
from ray import exceptions as rex

from retriever.index.distributed import RayExecutor
from retriever.index.errors import DistributedError, RetrieverError

from ..engine import Engine, _and_masks, search_leg
from ..legs.base import SearchContext, TopK
from ..shards import IndexReader
from ..stats import BM25Stats, CorpusStats
from ..topk import merge_topk

#: legs whose queries are prepared (encoded) once on the driver and shipped as vectors; the others
#: ship their query text and are prepared by every actor (BM25: analysis is cheap and its
#: prepared batch holds per-shard scoring state)
DRIVER_PREPARED = frozenset({"dense", "sparse"})
#: concurrent calls one actor serves (the legs of a hybrid search run side by side)
ACTOR_CONCURRENCY = 4


@dataclass(frozen=True)
class TextBatch:
    """A leg's queries shipped as text (prepared on each actor).

    Attributes:
        texts: the query strings (non-blank ones).
        params: the leg's parameter object (or ``None`` for its defaults).
    """

    texts: list[str]
    params: Any

    @property
    def n_queries(self) -> int:
        """Queries in the batch."""
        return len(self.texts)


def held_stats(reader: IndexReader, shard_ids: Sequence[int]) -> CorpusStats:
    """The statistics of the shards ``shard_ids`` alone (to be combined over every actor with
    :meth:`CorpusStats.combine`): N = their rows, BM25 df / sum of lengths from each shard's
    postings (:meth:`BM25Stats.of_shard`), as the one-process BM25 leg computes them."""
    n_docs = int(sum(reader.shards[i].rows for i in shard_ids))
    if "bm25" not in reader.legs:
        return CorpusStats(n_docs)
    from ..legs.bm25 import load_bm25_arrays

    n_terms = int(reader.manifest["stats"]["n_terms"])
    parts = []
    for i in shard_ids:
        a = load_bm25_arrays(reader, reader.shards[i], n_terms)
        parts.append(BM25Stats.of_shard(a["offsets"], a["doc_len"], n_terms))
    return CorpusStats(n_docs, BM25Stats.combine(parts, n_terms))


class ShardSearcher:
    """A Ray actor's state: some shards of one index generation, searched with outside statistics.

    Args:
        path: the index directory (as the driver sees it; shared storage).
        generation: the driver's generation (the same snapshot on every actor).
        shard_ids: positions in the manifest's shard list this actor holds.
        leg_options: ``use_gpu`` / ``device`` for the leg loaders.
    """

    def __init__(self, path: str, generation: int, shard_ids: Sequence[int], leg_options: dict[str, Any]) -> None:
        self.reader = IndexReader(path, generation=generation)
        self.shard_ids = tuple(int(s) for s in shard_ids)
        self.leg_options = dict(leg_options)
        self.engine: Engine | None = None
        self._lock = threading.Lock()

    def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()

    def held_stats(self) -> CorpusStats:
        """Statistics of the held shards (:func:`held_stats`)."""
        return held_stats(self.reader, self.shard_ids)

    def _engine(self, stats_box: list) -> Engine:
        """The engine over the held shards, built on first use with the statistics in
        ``stats_box[0]`` (an object reference: after a restart the actor fetches them again)."""
        with self._lock:
            if self.engine is None:
                stats = ray.get(stats_box[0])
                self.engine = Engine(self.reader, shards=self.shard_ids, stats=stats, concurrent_legs=False,
                                     **self.leg_options)
            return self.engine

    def load(self, stats_box: list) -> int:
        """Open the legs now (at ``Retriever.open``, not at the first query); returns the pid."""
        self._engine(stats_box)
        return os.getpid()

    def search(self, stats_box: list, leg: str, prepared: Any, depth: int, n_threads: int,
               allow: Sequence[np.ndarray | None] | None, shards: Sequence[int] | None = None) -> TopK:
        """Top-``depth`` of the held shards (or of the held positions ``shards``) for one leg.

        Args:
            prepared: the driver's prepared batch, or a :class:`TextBatch` to prepare here.
            allow: per held shard the query's allow mask (or None); ANDed with the tombstones.

        Returns:
            ``(ids int64 (nq, depth) global ordinals, scores float32, n_found int32)``.
        """
        engine = self._engine(stats_box)
        obj = engine.legs[leg]
        if isinstance(prepared, TextBatch):
            prepared = obj.prepare(prepared.texts, prepared.params, n_threads)
        elif leg == "sparse":  # the driver holds no postings: the float32 range check runs here
            prepared = obj._prepared(prepared.batch, prepared.params)
        ctx = SearchContext(depth=depth, n_threads=max(1, int(n_threads)), allow=_and_masks(engine.live, allow))
        if shards is None:
            return search_leg(obj, prepared, ctx)
        return obj.search_shards(prepared, list(shards), ctx)

    def score_docs(self, stats_box: list, leg: str, prepared: Any, shard: int, offsets: np.ndarray,
                   ordinals: np.ndarray) -> np.ndarray:
        """``leg.score_docs`` on held position ``shard`` (see the leg protocol)."""
        engine = self._engine(stats_box)
        obj = engine.legs[leg]
        if isinstance(prepared, TextBatch):
            prepared = obj.prepare(prepared.texts, prepared.params, 1)
        return obj.score_docs(prepared, shard, offsets, ordinals)


class RemoteLeg:
    """A leg on the driver whose shards live on the actors (the leg protocol of
    :mod:`retriever.legs.base`): ``prepare`` runs the zero-shard local leg (or ships the text),
    ``search_shards`` scatters to every actor and merges their top-k with
    :func:`retriever.topk.merge_topk`. Other attributes are the local leg's."""

    def __init__(self, name: str, local: Any, engine: "DistributedEngine") -> None:
        self.name = name
        self.local = local
        self.n_shards = len(engine.reader.shards)
        self._engine = engine

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.__dict__["local"], attr)

    def prepare(self, queries: Sequence[str], params: Any, n_threads: int) -> Any:
        """Encode on the driver (:data:`DRIVER_PREPARED`) or ship the text (:class:`TextBatch`)."""
        if self.name in DRIVER_PREPARED:
            return self.local.prepare(queries, params, n_threads)
        if params is not None and not isinstance(params, getattr(self.local, "Params", object)):
            self.local.prepare([], params, n_threads)  # the leg's own parameter-type error, here
        return TextBatch(list(queries), params)

    def prepare_vectors(self, vectors: Any, params: Any, n_threads: int) -> Any:
        """User query vectors, validated and prepared on the driver."""
        return self.local.prepare_vectors(vectors, params, n_threads)

    def search_shards(self, prepared: Any, shards: Sequence[int], ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` over ``shards`` (global positions), gathered from their actors."""
        return self._engine.gather(self.name, prepared, ctx, shards)

    def search_shard(self, prepared: Any, shard: int, ctx: SearchContext) -> TopK:
        """Top-``ctx.depth`` of one shard, from the actor holding it."""
        return self._engine.gather(self.name, prepared, ctx, [shard])

    def score_docs(self, prepared: Any, shard: int, offsets: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        """Exact scores of documents of shard ``shard``, computed by the actor holding it."""
        return self._engine.score_remote(self.name, prepared, shard, offsets, ordinals)


class DistributedEngine(Engine):
    """An :class:`~retriever.engine.Engine` whose shards are held by Ray actors.

    Args:
        reader: the driver's opened index (its generation is the one every actor opens).
        executor: the cluster and the assignment of shards to actors (:meth:`RayExecutor.assign`).
        concurrent_legs: as for :class:`~retriever.engine.Engine` (the legs' round trips overlap).
        leg_options: ``use_gpu`` / ``device`` (the actors' legs and the driver's query encoders).

    Attributes:
        assignment: ``assignment[i]``: the shard positions actor ``i`` holds.

    Raises:
        DistributedError: an actor failed while opening its shards (names them).
        IndexFormatError: a shard an actor opened is corrupt (raised as itself).
    """

    def __init__(self, reader: IndexReader, executor: RayExecutor, *, concurrent_legs: bool = True,
                 **leg_options: Any) -> None:
        executor.connect()
        self.executor = executor
        self.assignment = executor.assign([s.rows for s in reader.shards])
        self._owner = {s: (a, pos) for a, held in enumerate(self.assignment) for pos, s in enumerate(held)}
        opts: dict[str, Any] = {"num_cpus": executor.num_cpus_per_worker, "num_gpus": executor.num_gpus_per_worker,
                                "max_restarts": executor.max_restarts, "max_task_retries": executor.max_restarts,
                                "max_concurrency": ACTOR_CONCURRENCY}
        cls = ray.remote(ShardSearcher).options(**opts)
        self.actors = [cls.remote(str(reader.path), reader.generation, held, leg_options) for held in self.assignment]
        try:
            parts = self._gather([a.held_stats.remote() for a in self.actors])
            stats = CorpusStats.combine(parts)
            #: the statistics in the object store, boxed so that calls pass the reference itself
            self._stats_box = [ray.put(stats)]
            self.pids = self._gather([a.load.remote(self._stats_box) for a in self.actors])
            super().__init__(reader, shards=(), stats=stats, concurrent_legs=concurrent_legs, **leg_options)
        except BaseException:
            self.close()
            raise
        self.shard_ids = tuple(range(len(reader.shards)))
        self.live = (None,) * len(reader.shards)  # tombstones are applied by the actors holding the shards
        self.legs = {name: RemoteLeg(name, leg, self) for name, leg in self.legs.items()}

    def describe(self, actor: int) -> str:
        """``"actor i (shards [..]: dirs)"`` for messages."""
        held = self.assignment[actor]
        dirs = ", ".join(self.reader.shards[s].entry.get("dir", str(s)) for s in held)
        return f"Ray actor {actor} holding shards {held} ({dirs})"

    def _gather(self, calls: list, actors: Sequence[int] | None = None) -> list:
        """``ray.get`` of one call per actor (``actors[j]`` made ``calls[j]``); an actor that died for
        good is a :class:`DistributedError` naming its shards; an error raised by our code on the
        actor is raised again as itself (a :class:`RetrieverError`)."""
        actors = range(len(calls)) if actors is None else actors
        out = []
        for a, ref in zip(actors, calls):
            try:
                out.append(ray.get(ref))
            except rex.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, RetrieverError):
                    raise cause from None
                raise DistributedError(f"{self.describe(a)} failed: {cause!r}; no partial results") from None
            except (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.RaySystemError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise DistributedError(f"{self.describe(a)} died ({type(e).__name__}: {first}) after "
                                       f"{self.executor.max_restarts} restart(s); no partial results") from None
        return out

    def gather(self, leg: str, prepared: Any, ctx: SearchContext, shards: Sequence[int] | None = None) -> TopK:
        """Scatter one leg's prepared batch to the actors holding ``shards`` (global positions),
        each returning its top-``ctx.depth``; merged by (score desc, ordinal asc)."""
        ref = ray.put(prepared)
        wanted = None if shards is None else set(int(s) for s in shards)
        calls, actors = [], []
        for a, held in enumerate(self.assignment):
            mine = held if wanted is None else [s for s in held if s in wanted]
            if not mine:
                continue
            local = None if wanted is None or len(mine) == len(held) else [self._owner[s][1] for s in mine]
            allow = None if ctx.allow is None else [ctx.allow[s] for s in held]
            calls.append(self.actors[a].search.remote(self._stats_box, leg, ref, ctx.depth, ctx.n_threads, allow,
                                                      local))
            actors.append(a)
        parts = self._gather(calls, actors)
        return merge_topk(parts, ctx.depth)

    def score_remote(self, leg: str, prepared: Any, shard: int, offsets: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        """``score_docs`` of one shard on the actor holding it."""
        a, pos = self._owner[int(shard)]
        call = self.actors[a].score_docs.remote(self._stats_box, leg, prepared, pos, offsets, ordinals)
        return self._gather([call], [a])[0]

    def close(self) -> None:
        """Stop the actors (their memory maps go with them)."""
        for a in getattr(self, "actors", []):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
