"""retriever: a dense/sparse hybrid retrieval engine (BM25, learned sparse, dense) with a
compiled C++ core.

Public API: :class:`Retriever`, :func:`build_index`, result types, fusion configs, config
dataclasses and error types.
"""

import importlib.util as _ilu
import sys as _sys
from importlib import import_module as _import_module
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING


def _map_source_index() -> None:
    """Make ``retriever.index`` the ``index/`` folder beside *this* ``retriever/`` folder.

    An installed wheel holds it at ``retriever/index/`` (``package_dir`` in setup.py) and nothing is
    done. In a source checkout (an editable install, or the repository root on ``sys.path``) the
    folder sits beside ``retriever/``; an editable install's finder would map it to the checkout
    that was installed, not to the one imported (another worktree), so it is mapped here."""
    here = _Path(__file__).resolve().parent
    src = here.parent / "index" / "__init__.py"
    if (here / "index").is_dir() or f"{__name__}.index" in _sys.modules or not src.is_file():
        return
    spec = _ilu.spec_from_file_location(f"{__name__}.index", src, submodule_search_locations=[str(src.parent)])
    assert spec is not None and spec.loader is not None
    module = _ilu.module_from_spec(spec)
    _sys.modules[spec.name] = module
    spec.loader.exec_module(module)


_map_source_index()

# The public names are imported on first use (PEP 562 ``__getattr__``), so that importing a
# submodule (``retriever.cli`` for ``retriever --help``, ``retriever.index.config``) does not load
# the search engine, Arrow datasets, numba and the rest. ``from retriever import Retriever`` works
# as before.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("AnalyzerConfig", "BM25Params", "BuildConfig", "DenseConfig"), "index.config"),
    "RayExecutor": "index.distributed",
    **dict.fromkeys(("ConfigError", "CorpusError", "DistributedError", "IndexExistsError", "IndexFormatError",
                     "IndexLockedError", "ModelError", "QueryError", "RetrieverError"), "index.errors"),
    "build_index": "index.pipeline",
    **dict.fromkeys(("CompactPolicy", "IndexUpdater"), "index.updates"),
    "Retriever": "api",
    **dict.fromkeys(("RRF", "Combined", "Linear"), "fusion"),
    **dict.fromkeys(("BM25SearchParams", "DenseSearchParams", "SparseSearchParams"), "params"),
    **dict.fromkeys(("BatchResult", "Hit", "LegArrays", "LegHit"), "results"),
}

__version__ = "0.1.0"

__all__ = [
    "Retriever", "build_index", "IndexUpdater", "CompactPolicy", "Hit", "LegHit", "LegArrays", "BatchResult", "RRF", "Linear", "Combined",
    "BuildConfig", "BM25Params", "AnalyzerConfig", "DenseConfig",
    "BM25SearchParams", "DenseSearchParams", "SparseSearchParams",
    "RetrieverError", "ConfigError", "CorpusError", "IndexFormatError", "IndexExistsError", "IndexLockedError",
    "ModelError", "QueryError", "DistributedError", "RayExecutor",
]


def __getattr__(name: str) -> object:
    """A public name (:data:`__all__`), imported from its module on first use."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if _TYPE_CHECKING:  # the names as static analysers and IDEs see them
    from retriever.index.config import AnalyzerConfig, BM25Params, BuildConfig, DenseConfig
    from retriever.index.distributed import RayExecutor
    from retriever.index.errors import (ConfigError, CorpusError, DistributedError, IndexExistsError,
                                        IndexFormatError, IndexLockedError, ModelError, QueryError, RetrieverError)
    from retriever.index.pipeline import build_index
    from retriever.index.updates import CompactPolicy, IndexUpdater

    from .api import Retriever
    from .fusion import RRF, Combined, Linear
    from .params import BM25SearchParams, DenseSearchParams, SparseSearchParams
    from .results import BatchResult, Hit, LegArrays, LegHit
