"""retriever: a dense/sparse hybrid retrieval engine (BM25, learned sparse, dense) with a
compiled C++ core.

Public API: :class:`Retriever`, :func:`build_index`, result types, fusion configs, config
dataclasses and error types.
"""

from retriever.index.config import AnalyzerConfig, BM25Params, BuildConfig, DenseConfig
from retriever.index.errors import (ConfigError, CorpusError, IndexExistsError, IndexFormatError, ModelError,
                          QueryError, RetrieverError)
from retriever.index.pipeline import build_index

from .api import Retriever
from .fusion import RRF, Linear
from .results import BatchResult, Hit, LegArrays, LegHit

__version__ = "0.1.0"

__all__ = [
    "Retriever", "build_index", "Hit", "LegHit", "LegArrays", "BatchResult", "RRF", "Linear",
    "BuildConfig", "BM25Params", "AnalyzerConfig", "DenseConfig",
    "RetrieverError", "ConfigError", "CorpusError", "IndexFormatError", "IndexExistsError",
    "ModelError", "QueryError",
]
