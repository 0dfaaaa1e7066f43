"""Exception types of the project (one module, shared by ``index/`` and ``retriever/``).

Every error raised on bad user input is a :class:`RetrieverError`; the message names the file,
line, field or argument and the offending value, so a CLI can print it on one line.
"""

from __future__ import annotations

from pathlib import Path


class RetrieverError(Exception):
    """Base class of every error this project raises on bad input or a bad index."""


class ConfigError(RetrieverError, ValueError):
    """An invalid build or search parameter (names the parameter and the value)."""


class CorpusError(RetrieverError, ValueError):
    """A corpus record that cannot be indexed.

    Attributes:
        path: the corpus file (``None`` for Python iterables).
        line: 1-based line (JSONL/CSV) or row (Parquet, iterables) number, or ``None``.
        field: the offending field name, or ``None``.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class IndexFormatError(RetrieverError, ValueError):
    """An index directory that is missing, incomplete, corrupted or of an unknown format."""


class IndexExistsError(RetrieverError, FileExistsError):
    """The output directory of a build already holds something and ``overwrite`` was not given."""


class QueryError(RetrieverError, ValueError):
    """An invalid query or search argument (k, mode, fusion, vector shape...)."""


class ModelError(RetrieverError, ValueError):
    """An encoder model that cannot be found or loaded (names the path)."""


class IndexLockedError(RetrieverError):
    """Another writer holds the index's writer lock (the message names its process id)."""


class DistributedError(RetrieverError):
    """A distributed build or search failed on a worker (a Ray actor or task died, or the cluster
    could not be reached); the message names the worker's shards (search) or the part of the
    corpus (build). No partial result or partial index is ever returned or made visible."""
