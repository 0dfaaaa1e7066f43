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
import time
from collections import OrderedDict, deque
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
#: a prepared query batch up to this size (:func:`payload_bytes`) travels inside each actor's call
#: (Ray inlines arguments up to 100 KiB in the call itself); a larger one sent to several actors is
#: put in the object store once and passed by reference. A ``ray.put`` costs about 1-2 ms (a
#: shared-memory object and its bookkeeping), more than a one-query call's whole search, while a
#: batch of 1,000 dense queries (1.5 MB) would otherwise be serialised once per actor.
INLINE_BYTES = 100 * 1024
#: filters whose per-actor masks (when larger than :data:`INLINE_BYTES`) a driver keeps in the
#: object store, so that every leg of a search and later searches with the same filter pass a
#: reference instead of sending the masks again
MASK_REFS_KEPT = 8


def payload_bytes(obj: Any, _depth: int = 0) -> int:
    """An estimate of the bytes ``obj`` takes on the wire: NumPy arrays by ``nbytes``, strings and
    bytes by length, containers and objects with attributes by the sum of their parts (4 levels
    deep), anything else 8. Used to choose between inlining an argument and ``ray.put``."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (str, bytes, bytearray)):
        return len(obj)
    if _depth >= 4:
        return 8
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(x, _depth + 1) for x in obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(x, _depth + 1) for x in obj.values())
    attrs = getattr(obj, "__dict__", None)
    if attrs is not None:
        return sum(payload_bytes(x, _depth + 1) for x in attrs.values())
    return 8


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
    :meth:`CorpusStats.combine`): N = their rows, BM25 statistics of their live documents
    (:func:`retriever.legs.bm25.live_shard_stats`), as the one-process engine computes them."""
    n_docs = int(sum(reader.shards[i].rows for i in shard_ids))
    if "bm25" not in reader.legs:
        return CorpusStats(n_docs)
    from ..legs.bm25 import live_shard_stats, load_bm25_arrays

    n_terms = int(reader.manifest["stats"]["n_terms"])
    parts = [live_shard_stats(reader, reader.shards[i], load_bm25_arrays(reader, reader.shards[i], n_terms), n_terms)
             for i in shard_ids]
    return CorpusStats(n_docs, BM25Stats.combine(parts, n_terms))


#: what one actor is asked to hold: ``(generation, shard positions, [statistics reference])``;
#: every call carries it, so an actor restarted by Ray (or asked about a newer generation after a
#: refresh) opens what the call needs
Spec = tuple


class ShardSearcher:
    """A Ray actor's state: engines over some shards of an index generation, scored with outside
    statistics, built on first use per :data:`Spec` (the last :attr:`KEEP` kept) and sharing one
    :class:`~retriever.segcache.SegmentCache`, so a refresh loads only new segments.

    Args:
        path: the index directory (as the driver sees it; shared storage).
        leg_options: ``use_gpu`` / ``device`` for the leg loaders.
    """

    #: engines (generations) an actor keeps: the current one and the one a refresh replaced
    KEEP = 2
    #: search calls whose timings an actor keeps for :meth:`take_timings` (the latest ones)
    TIMINGS_KEPT = 100_000

    def __init__(self, path: str, leg_options: dict[str, Any]) -> None:
        from ..segcache import SegmentCache

        self.path = path
        self.leg_options = dict(leg_options)
        self.cache = SegmentCache()
        self.engines: dict[tuple[int, tuple[int, ...]], Engine] = {}
        self._lock = threading.Lock()
        #: per search call ``(leg, queries, shards searched, ms inside the actor)``
        self.timings: deque[tuple[str, int, int, float]] = deque(maxlen=self.TIMINGS_KEPT)

    def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()

    def held_stats(self, generation: int, shard_ids: Sequence[int]) -> CorpusStats:
        """Statistics of the given shards of ``generation`` (:func:`held_stats`)."""
        return held_stats(IndexReader(self.path, generation=generation), shard_ids)

    def _engine(self, spec: Spec) -> Engine:
        """The engine of ``spec``, built on first use with the statistics ``spec[2][0]`` (an object
        reference, boxed so Ray passes it unresolved)."""
        generation, shard_ids, box = spec
        # the statistics reference too: an index rebuilt in place starts again at generation 1,
        # and its engines must not be taken for the replaced index's (each driver engine collects
        # its own statistics)
        key = (int(generation), tuple(shard_ids), box[0].hex() if box else None)
        with self._lock:
            engine = self.engines.get(key)
            if engine is None:
                reader = IndexReader(self.path, generation=generation)
                self.cache.mark()
                engine = Engine(reader, shards=key[1], stats=ray.get(box[0]), concurrent_legs=False,
                                cache=self.cache, **self.leg_options)
                self.engines[key] = engine
                while len(self.engines) > self.KEEP:
                    self.engines.pop(next(iter(self.engines)))
            return engine

    def take_timings(self) -> list[tuple[str, int, int, float]]:
        """The timings of the search calls since the last call (and forget them): per call
        ``(leg, queries, shards searched, milliseconds)`` from the call's start on the actor to
        its top-k (query preparation on the actor included, the transfer of the arguments and of
        the reply not), at most :attr:`TIMINGS_KEPT` of the latest calls."""
        out = list(self.timings)
        self.timings.clear()
        return out

    def load(self, spec: Spec) -> int:
        """Open the legs of ``spec`` now (at open / refresh, not at the first query); the pid."""
        self._engine(spec)
        return os.getpid()

    def forget(self, generation: int) -> None:
        """Drop the engines of generations before ``generation``."""
        with self._lock:
            for key in [k for k in self.engines if k[0] < generation]:
                del self.engines[key]

    def search(self, spec: Spec, leg: str, prepared: Any, depth: int, n_threads: int,
               allow: Sequence[np.ndarray | None] | None, shards: Sequence[int] | None = None) -> TopK:
        """Top-``depth`` of the held shards (or of the held positions ``shards``) for one leg.

        Args:
            prepared: the driver's prepared batch, or a :class:`TextBatch` to prepare here.
            allow: per held shard the query's allow mask (or None); ANDed with the tombstones.

        Returns:
            ``(ids int64 (nq, depth) global ordinals, scores float32, n_found int32)``.
        """
        t0 = time.perf_counter()
        engine = self._engine(spec)
        obj = engine.legs[leg]
        if isinstance(prepared, TextBatch):
            prepared = obj.prepare(prepared.texts, prepared.params, n_threads)
        elif leg == "sparse":  # the driver holds no postings: the float32 range check runs here
            prepared = obj._prepared(prepared.batch, prepared.params)
        ctx = SearchContext(depth=depth, n_threads=max(1, int(n_threads)), allow=_and_masks(engine.live, allow))
        if shards is None:
            out = search_leg(obj, prepared, ctx)
        else:
            out = obj.search_shards(prepared, list(shards), ctx)
        self.timings.append((leg, int(prepared.n_queries), obj.n_shards if shards is None else len(shards),
                             (time.perf_counter() - t0) * 1e3))
        return out

    def score_docs(self, spec: Spec, leg: str, prepared: Any, shard: int, offsets: np.ndarray,
                   ordinals: np.ndarray) -> np.ndarray:
        """``leg.score_docs`` on held position ``shard`` (see the leg protocol)."""
        obj = self._engine(spec).legs[leg]
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
    """An :class:`~retriever.engine.Engine` whose shards are held by Ray actors (fusions that
    need the legs' theoretical score ranges, ``tmm`` and ``theoretical``, are refused: the
    driver holds no shards to compute them from).

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

    #: the driver's legs hold no shards: no theoretical score ranges (tmm / theoretical fusion)
    computes_bounds = False

    def __init__(self, reader: IndexReader, executor: RayExecutor, *, concurrent_legs: bool = True,
                 previous: "DistributedEngine | None" = None, **leg_options: Any) -> None:
        executor.connect()
        self.executor = executor
        self.leg_options = dict(leg_options)
        self.concurrent_legs = bool(concurrent_legs)
        if previous is None:
            self.assignment = executor.assign([s.rows for s in reader.shards])
            opts: dict[str, Any] = {"num_cpus": executor.num_cpus_per_worker,
                                    "num_gpus": executor.num_gpus_per_worker,
                                    "max_restarts": executor.max_restarts, "max_task_retries": executor.max_restarts,
                                    "max_concurrency": ACTOR_CONCURRENCY}
            cls = ray.remote(ShardSearcher).options(**opts)
            self.actors = [cls.remote(str(reader.path), self.leg_options) for _ in self.assignment]
        else:
            self.assignment = reassign(previous, reader)
            self.actors = list(previous.actors)
        self._owner = {s: (a, pos) for a, held in enumerate(self.assignment) for pos, s in enumerate(held)}
        #: ids of a mask list's masks -> (the masks, per actor its masks or their object reference)
        self._mask_refs: OrderedDict[tuple[int, ...], tuple[list[Any], list[Any]]] = OrderedDict()
        self._mask_lock = threading.Lock()
        try:
            parts = self._gather([a.held_stats.remote(reader.generation, held)
                                  for a, held in zip(self.actors, self.assignment) if held],
                                 [i for i, held in enumerate(self.assignment) if held], reader)
            stats = CorpusStats.combine(parts)
            box = [ray.put(stats)]  # the statistics in the object store, boxed: calls pass the reference
            #: per actor what it holds: (generation, shard positions, [statistics reference])
            self.specs: list[Spec] = [(reader.generation, tuple(held), box) for held in self.assignment]
            self.pids = self._gather([a.load.remote(spec) for a, spec in zip(self.actors, self.specs)], None, reader)
            super().__init__(reader, shards=(), stats=stats, concurrent_legs=concurrent_legs, **leg_options)
        except BaseException:
            if previous is None:
                self.close()
            raise
        self.shard_ids = tuple(range(len(reader.shards)))
        self.live = (None,) * len(reader.shards)  # tombstones are applied by the actors holding the shards
        self.legs = {name: RemoteLeg(name, leg, self) for name, leg in self.legs.items()}

    def reopen(self, reader: IndexReader) -> "DistributedEngine":
        """An engine over ``reader`` (a newer generation of the same index) on the same actors:
        each keeps the segments it holds, new segments go to the actor holding the fewest
        documents (largest segment first), statistics are collected again (:func:`reassign`)."""
        return DistributedEngine(reader, self.executor, concurrent_legs=self.concurrent_legs, previous=self,
                                 **self.leg_options)

    def forget(self) -> None:
        """Tell the actors to drop engines of generations older than this engine's successor."""
        for a in self.actors:
            a.forget.remote(self.reader.generation + 1)

    def describe(self, actor: int, reader: IndexReader | None = None) -> str:
        """``"actor i (shards [..]: dirs)"`` for messages."""
        held = self.assignment[actor]
        shards = (reader or self.reader).shards
        dirs = ", ".join(shards[s].entry.get("dir", str(s)) for s in held)
        return f"Ray actor {actor} holding shards {held} ({dirs})"

    def _gather(self, calls: list, actors: Sequence[int] | None = None, reader: IndexReader | None = None) -> list:
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
                raise DistributedError(f"{self.describe(a, reader)} failed: {cause!r}; no partial results") from None
            except (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.RaySystemError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise DistributedError(f"{self.describe(a, reader)} died ({type(e).__name__}: {first}) after "
                                       f"{self.executor.max_restarts} restart(s); no partial results") from None
        return out

    def gather(self, leg: str, prepared: Any, ctx: SearchContext, shards: Sequence[int] | None = None) -> TopK:
        """Scatter one leg's prepared batch to the actors holding ``shards`` (global positions),
        each returning its top-``ctx.depth``; merged by (score desc, ordinal asc). The prepared
        batch travels inside each call, or once through the object store when it is larger than
        :data:`INLINE_BYTES` and goes to several actors."""
        wanted = None if shards is None else set(int(s) for s in shards)
        targets = []
        for a, held in enumerate(self.assignment):
            mine = held if wanted is None else [s for s in held if s in wanted]
            if mine:
                targets.append((a, held, None if wanted is None or len(mine) == len(held)
                                else [self._owner[s][1] for s in mine]))
        shipped = (ray.put(prepared) if len(targets) > 1 and payload_bytes(prepared) > INLINE_BYTES
                   else prepared)
        masks = self._masks(ctx.allow)
        calls, actors = [], []
        for a, held, local in targets:
            allow = masks[a]
            calls.append(self.actors[a].search.remote(self.specs[a], leg, shipped, ctx.depth, ctx.n_threads, allow,
                                                      local))
            actors.append(a)
        parts = self._gather(calls, actors)
        return merge_topk(parts, ctx.depth)

    def _masks(self, allow: Sequence[np.ndarray | None] | None) -> list[Any]:
        """Per actor what its ``search`` call receives as ``allow``: ``None``, its shards' masks
        (inside the call), or, when they exceed :data:`INLINE_BYTES`, an object reference to them.
        The references of read-only masks (those of ``Retriever.filter_masks``, cached per filter
        and generation) are kept for the last :data:`MASK_REFS_KEPT` mask lists, so a filter's
        masks reach each actor once, not once per leg and search; an actor resolves the reference
        when it reads the argument (Ray passes a top-level reference resolved)."""
        if allow is None:
            return [None] * len(self.assignment)
        key = tuple(id(m) for m in allow)
        # one lock over lookup, put and insert: the legs of a hybrid search call this at the same
        # time, and two that both missed the cache would each put the same masks
        with self._mask_lock:
            hit = self._mask_refs.get(key)
            if hit is not None and all(x is y for x, y in zip(hit[0], allow)):
                self._mask_refs.move_to_end(key)
                return hit[1]
            out: list[Any] = []
            for held in self.assignment:
                mine = [allow[s] for s in held]
                big = sum(0 if m is None else int(m.nbytes) for m in mine) > INLINE_BYTES
                out.append(ray.put(mine) if big else mine)
            frozen = all(m is None or not m.flags.writeable for m in allow)
            if frozen and any(isinstance(x, ray.ObjectRef) for x in out):
                self._mask_refs[key] = (list(allow), out)  # holding the masks keeps their ids unique
                while len(self._mask_refs) > MASK_REFS_KEPT:
                    self._mask_refs.popitem(last=False)
        return out

    def score_remote(self, leg: str, prepared: Any, shard: int, offsets: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        """``score_docs`` of one shard on the actor holding it."""
        a, pos = self._owner[int(shard)]
        call = self.actors[a].score_docs.remote(self.specs[a], leg, prepared, pos, offsets, ordinals)
        return self._gather([call], [a])[0]

    def actor_timings(self) -> list[list[tuple[str, int, int, float]]]:
        """Per actor the timings of its search calls since the last call
        (:meth:`ShardSearcher.take_timings`: ``(leg, queries, shards searched, ms on the actor)``
        per call), for benchmarks and monitoring.

        Raises:
            DistributedError: an actor died (names its shards).
        """
        return self._gather([a.take_timings.remote() for a in self.actors])

    def close(self) -> None:
        """Stop the actors (their memory maps go with them)."""
        for a in getattr(self, "actors", []):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []


def reassign(previous: DistributedEngine, reader: IndexReader) -> list[list[int]]:
    """The shards each of ``previous``'s actors holds in ``reader``'s generation: a segment (shard
    directory) the previous generation listed stays on its actor; new segments go, largest first,
    to the actor holding the fewest documents (ties: the lower actor). An actor may end up holding
    nothing (its segments compacted away); it is skipped until a later refresh gives it some."""
    where = {previous.reader.shards[s].entry["dir"]: a for a, held in enumerate(previous.assignment) for s in held}
    out: list[list[int]] = [[] for _ in previous.actors]
    load = [0] * len(out)
    new = []
    for i, s in enumerate(reader.shards):
        a = where.get(s.entry["dir"])
        if a is None:
            new.append(i)
        else:
            out[a].append(i)
            load[a] += s.rows
    for i in sorted(new, key=lambda i: (-reader.shards[i].rows, i)):
        a = min(range(len(out)), key=lambda j: (load[j], j))
        out[a].append(i)
        load[a] += reader.shards[i].rows
    return [sorted(h) for h in out]
