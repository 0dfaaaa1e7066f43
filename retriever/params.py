"""Per-call search parameters of each leg, as typed dataclasses.

``Retriever.search*(..., leg_params=...)`` takes, per leg, either one of these objects or a plain
dict of its fields (what the CLI's ``--leg-params`` JSON gives); :func:`parse_leg_params` turns the
dicts into objects, so an unknown key is an error naming the key and the valid ones, and every
value is checked before any leg runs. The objects are frozen: one may be shared between threads and
calls.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import numpy as np

from retriever.index.config import LEGS, BM25Params
from retriever.index.errors import ConfigError, QueryError

#: the exact top-k algorithms of the BM25 kernel (all return identical ids and scores)
BM25_ALGORITHMS = ("auto", "exhaustive", "maxscore", "bmw", "bmm")
#: the learned-sparse leg's algorithms: exact, or Seismic-style approximate
SPARSE_ALGORITHMS = ("exact", "seismic")
#: element types of the dense leg's exact prefix scan (``scan_dtype``)
SCAN_DTYPES = ("float32", "int8")
#: Query-time defaults of the sparse approximate mode; how they were chosen (the recall / QPS
#: sweep and its command) is recorded in ``benchmarks/HISTORY.md`` (learned-sparse section).
DEFAULT_QUERY_CUT = 10
DEFAULT_HEAP_FACTOR = 0.9


#: Filter planner thresholds (passing fraction of a shard below which an approximate mode scans
#: the passing documents exactly); how they were chosen is in benchmarks/HISTORY.md (filters).
DEFAULT_SPARSE_FILTER_EXACT_BELOW = 0.05
DEFAULT_DENSE_FILTER_EXACT_BELOW = 0.05


def _check_fraction(leg: str, name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(v) <= 1.0:
        raise QueryError(f"{leg} leg_params {name!r} must be a number in [0, 1], got {v!r}")


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def _opt_int(leg: str, name: str, v: Any, lo: int = 1) -> int | None:
    if v is None:
        return None
    if not _is_int(v) or v < lo:
        raise QueryError(f"{leg} leg_params {name!r} must be an integer >= {lo}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class BM25SearchParams:
    """BM25 leg options for one call.

    Attributes:
        algorithm: ``"auto"`` (exhaustive term-at-a-time on shards of at most
            ``_kernels.BM25_AUTO_EXHAUSTIVE_DOCS`` documents and for queries whose lists are short,
            MaxScore otherwise), ``"exhaustive"``, ``"maxscore"`` (Turtle & Flood, IP&M 1995),
            ``"bmw"`` (block-max WAND, Ding & Suel, SIGIR 2011) or ``"bmm"`` (block-max MaxScore).
            All return identical ids and scores.
        k1, b: BM25 parameters for this call (``None``: the index's). Other values build
            per-posting impacts and bounds for them on first use (O(postings), cached).

    Raises:
        QueryError: an unknown algorithm, ``k1`` not finite >= 0, ``b`` outside [0, 1].
    """

    leg: ClassVar[str] = "bm25"
    algorithm: str = "auto"
    k1: float | None = None
    b: float | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in BM25_ALGORITHMS:
            raise QueryError(f"bm25 algorithm must be one of {', '.join(BM25_ALGORITHMS)}; got {self.algorithm!r}")
        if self.k1 is not None or self.b is not None:
            try:  # the build config's own checks, so both sides accept the same values
                BM25Params(k1=1.0 if self.k1 is None else self.k1, b=0.5 if self.b is None else self.b)
            except ConfigError as e:
                raise QueryError(str(e)) from None

    def resolve(self, index: BM25Params) -> tuple[float, float]:
        """``(k1, b)`` of this call: the given values, else the index's."""
        return (float(index.k1 if self.k1 is None else self.k1), float(index.b if self.b is None else self.b))


@dataclass(frozen=True)
class SparseSearchParams:
    """Learned-sparse leg options for one call.

    Attributes:
        algorithm: ``"exact"`` (score-at-a-time with safe early termination, forward-index
            re-scoring) or ``"seismic"`` (approximate, after Bruch et al., "Efficient Inverted
            Indexes for Approximate Retrieval over Learned Sparse Representations", SIGIR 2024).
        query_cut: ``seismic`` only: query terms visited, largest weights first (>= 1).
        heap_factor: ``seismic`` only: a block is skipped when its summary score is below
            ``heap_factor`` times the current k-th score (in (0, 1]; the kernel checks the range).
        filter_exact_below: ``seismic`` only, the filter planner's threshold: on a shard where
            the allow mask (filter and deletes) passes a fraction of the rows below it, the exact
            kernel runs instead of Seismic (in [0, 1]; 0: never). See docs/SEARCH.md.

    Raises:
        QueryError: an unknown algorithm or a value of the wrong type.
    """

    leg: ClassVar[str] = "sparse"
    algorithm: str = "exact"
    query_cut: int = DEFAULT_QUERY_CUT
    heap_factor: float = DEFAULT_HEAP_FACTOR
    filter_exact_below: float = DEFAULT_SPARSE_FILTER_EXACT_BELOW

    def __post_init__(self) -> None:
        _check_fraction("sparse", "filter_exact_below", self.filter_exact_below)
        if self.algorithm not in SPARSE_ALGORITHMS:
            raise QueryError(f"sparse algorithm must be 'exact' or 'seismic', got {self.algorithm!r}")
        if not _is_int(self.query_cut):
            raise QueryError(f"sparse leg_params 'query_cut' must be an integer, got {self.query_cut!r}")
        if isinstance(self.heap_factor, bool) or not isinstance(self.heap_factor, (int, float, np.floating)) \
                or not math.isfinite(float(self.heap_factor)):
            raise QueryError(f"sparse leg_params 'heap_factor' must be a finite number, got {self.heap_factor!r}")


@dataclass(frozen=True)
class DenseSearchParams:
    """Dense leg options for one call (funnel search over Matryoshka prefixes; see
    :mod:`retriever.legs.dense`). Every field is optional.

    Attributes:
        dim: prefix length (1..d, default d) the candidate generator searches; prefixes of queries
            and documents are re-normalised to unit length.
        shortlist: candidates per shard kept for exact re-scoring (default ``k`` for a
            full-dimension search with the index's own structure, else ``max(10·k, 100)``; never
            below ``k``).
        index: FAISS factory string of the generator over the prefix (``"Flat"``,
            ``"IVF1024,Flat"``, ``"HNSW32"``, ``"PQ16"``...); default: the index's own structure at
            full dimension, ``"Flat"`` over a shorter prefix (on CPU the exact blocked scan).
        nprobe: IVF lists visited (default 16; capped at nlist).
        ef_search: HNSW efSearch (default: the index's; at least the shortlist).
        rescore: re-score the shortlist at full dimension from the stored vectors (default True);
            False returns the generator's (prefix) scores.
        batch_size: queries per FAISS call (default: sized to ~256 MiB) or per block of the exact
            prefix scan.
        scan_dtype: ``"float32"`` or ``"int8"`` (int8-quantised exact prefix scan; needs ``index``
            ``"Flat"`` or none).
        exhaustive: scan every stored vector with a raw inner product at full dimension (float32
            BLAS blocks, no re-normalisation, nothing cached), whatever ANN structure the index was
            built with: the exact reference (recall@k is measured against it). Excludes ``dim``,
            ``index``, ``scan_dtype="int8"`` and ``rescore=False``.
        filter_exact_below: the filter planner's threshold: on a shard where the allow mask
            (filter and deletes) passes a fraction of the rows below it, the passing documents are
            scanned exactly whatever the algorithm (in [0, 1]; 0: only IVF's cost rule applies).
            See docs/SEARCH.md.

    Raises:
        QueryError: a value of the wrong type or range (names the option and the value).
    """

    leg: ClassVar[str] = "dense"
    dim: int | None = None
    shortlist: int | None = None
    index: str | None = None
    nprobe: int | None = None
    ef_search: int | None = None
    rescore: bool = True
    batch_size: int | None = None
    scan_dtype: str = "float32"
    exhaustive: bool = False
    filter_exact_below: float = DEFAULT_DENSE_FILTER_EXACT_BELOW

    def __post_init__(self) -> None:
        _check_fraction("dense", "filter_exact_below", self.filter_exact_below)
        if not isinstance(self.exhaustive, bool):
            raise QueryError(f"dense leg_params 'exhaustive' must be True or False, got {self.exhaustive!r}")
        if self.exhaustive and (self.dim is not None or self.index is not None or self.scan_dtype != "float32"
                                or not self.rescore):
            raise QueryError("dense leg_params 'exhaustive' scans the full vectors exactly: it takes no 'dim', "
                             "'index', 'scan_dtype' or 'rescore'")
        for name in ("dim", "shortlist", "nprobe", "ef_search", "batch_size"):
            _opt_int("dense", name, getattr(self, name))
        if self.index is not None and (not isinstance(self.index, str) or not self.index.strip()):
            raise QueryError(f"dense leg_params 'index' must be a FAISS factory string, got {self.index!r}")
        if not isinstance(self.rescore, bool):
            raise QueryError(f"dense leg_params 'rescore' must be True or False, got {self.rescore!r}")
        if self.scan_dtype not in SCAN_DTYPES:
            raise QueryError(f"dense leg_params 'scan_dtype' must be one of {', '.join(SCAN_DTYPES)}, "
                             f"got {self.scan_dtype!r}")
        if self.scan_dtype == "int8" and self.index is not None and self.index.replace(" ", "") != "Flat":
            raise QueryError(f"dense leg_params 'scan_dtype' 'int8' is an exact prefix scan and needs index "
                             f"'Flat' or none, got index {self.index!r}")


LegParams = Union[BM25SearchParams, SparseSearchParams, DenseSearchParams]
#: leg name -> its parameter class
PARAM_TYPES: dict[str, type] = {"bm25": BM25SearchParams, "dense": DenseSearchParams, "sparse": SparseSearchParams}


def leg_param_names(leg: str) -> tuple[str, ...]:
    """The option names a leg accepts (its parameter class's fields)."""
    return tuple(f.name for f in dataclasses.fields(PARAM_TYPES[leg]))


def params_from_dict(leg: str, options: Mapping[str, Any]) -> LegParams:
    """One leg's options (a dict, e.g. from ``--leg-params`` JSON) as its parameter object.

    Raises:
        QueryError: an unknown leg or key (naming it and the valid ones), or a bad value.
    """
    if leg not in PARAM_TYPES:
        raise QueryError(f"leg_params: unknown leg {leg!r}; expected some of {', '.join(LEGS)}")
    if not isinstance(options, Mapping):
        raise QueryError(f"leg_params[{leg!r}] must be a dict of options, got {options!r}")
    names = leg_param_names(leg)
    unknown = sorted(str(o) for o in options if o not in names)
    if unknown:
        raise QueryError(f"unknown {leg} leg_params {unknown}; expected some of {', '.join(names)}")
    return PARAM_TYPES[leg](**options)


def parse_leg_params(leg_params: Any) -> dict[str, LegParams]:
    """``{leg: options}`` (options a parameter object or a dict of its fields) → ``{leg: object}``
    for the legs named; a leg not named gets its defaults from :func:`defaults_for`.

    Raises:
        QueryError: not a mapping, an unknown leg or option, an object of another leg's class, or a
            bad value (names the leg, the option and the value).
    """
    if leg_params is None:
        return {}
    if not isinstance(leg_params, Mapping):
        raise QueryError(f"leg_params must be a dict {{leg: {{option: value}}}}, got {type(leg_params).__name__}")
    out: dict[str, LegParams] = {}
    for leg, opts in leg_params.items():
        if leg not in PARAM_TYPES:
            raise QueryError(f"leg_params: unknown leg {leg!r}; expected some of {', '.join(LEGS)}")
        if dataclasses.is_dataclass(opts) and not isinstance(opts, type):
            if not isinstance(opts, PARAM_TYPES[leg]):
                raise QueryError(f"leg_params[{leg!r}] is a {type(opts).__name__}; expected "
                                 f"{PARAM_TYPES[leg].__name__} or a dict")
            out[leg] = opts
        else:
            out[leg] = params_from_dict(leg, opts)
    return out


_DEFAULTS: dict[str, LegParams] = {leg: cls() for leg, cls in PARAM_TYPES.items()}


def defaults_for(leg: str) -> LegParams:
    """The default (shared, frozen) parameter object of ``leg``."""
    return _DEFAULTS[leg]
