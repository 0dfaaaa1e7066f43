"""Typed metadata columns: Arrow types inferred from the records, one type per field per build.

Every record field other than id, title and text is metadata. The reader normalises each value
(:func:`normalize_value`); the builder (:class:`MetadataColumns`) infers one column type per field
over the whole build and writes each shard's metadata as a struct column ``metadata`` of
``docs.arrow`` (one child per field), plus ``metadata_nulls`` (the fields a record gave as an
explicit ``None``, so that a missing field and a ``None`` read back as before).

Column types (value kinds):

============================  =======================================  ==========================
Python value                  Arrow type                               read back as
============================  =======================================  ==========================
bool                          ``bool``                                 bool
int (numpy ints too)          ``int64`` (outside int64: an error)      int
float (numpy floats too)      ``float64`` (NaN / inf: an error)        float
str (bytes: decoded UTF-8)    ``large_string``                         str
naive ``datetime``            ``timestamp[us]``                        ``isoformat()`` string
aware ``datetime``            ``timestamp[us, tz=UTC]``                ``isoformat()`` in UTC
``date``                      ``date32``                               ``isoformat()`` string
list / tuple of str           ``large_list<large_string>``             list of str
anything else (dicts, lists   ``arrow.json`` extension (JSON text)     ``json.loads`` of the text
of other values, ...)
============================  =======================================  ==========================

Timestamps read back as the ISO strings that format 1 (one JSON string per record) returned, so
``IndexReader.fetch`` gives the same dicts as before for naive datetimes and dates; an aware
datetime comes back in UTC (``+00:00``), the instant unchanged. Other objects with ``isoformat``
(``time``) become their ISO string, and other unknown objects ``str(value)``, as before.
A field that holds values of two kinds in one build (``1`` and ``"1"``, or ``1`` and ``1.5``) is
a :class:`retriever.index.errors.CorpusError` naming the field, both types and the first record
of each. ``None`` fits every type, ``[]`` a list or JSON one; a shard in which a field has held
only ``[]`` (and ``None``) stores it as a column of empty lists (so the ``[]`` reads back) that
types nothing: its shard schema says null (:func:`shard_field_types`), and the field takes the type
its other values give it, in any shard layout.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .errors import CorpusError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

JSON_TYPE = pa.json_(pa.large_string())
#: type name -> Arrow type of a metadata column
KIND_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.large_string(),
    "timestamp": pa.timestamp("us"),
    "timestamp[UTC]": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "list<string>": pa.large_list(pa.large_string()),
    "json": JSON_TYPE,
}
NULLS_TYPE = pa.large_list(pa.large_string())


class JsonText(str):
    """A metadata value with no column type, held as its JSON text (what the JSON column stores)."""

    __slots__ = ()


class _EmptyList(list):
    """``[]``: fits a list-of-strings column and a JSON column alike."""

    __slots__ = ()


def _json_default(v: Any) -> Any:
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", errors="replace")
    if hasattr(v, "tolist"):
        return v.tolist()
    return str(v)


def _json_key(k: Any) -> str:
    """A mapping key as ``json.dumps`` writes it (metadata field names are strings)."""
    if isinstance(k, str):
        return k
    return next(iter(json.loads(json.dumps({k: 0}))))


def normalize_value(v: Any) -> Any:
    """One metadata value in the form the column builder types (see the module table).

    Returns:
        None, bool, int, float, str, datetime, date, a list of str (``[]`` as an empty-list
        marker), or a :class:`JsonText`.

    Raises:
        ValueError: NaN / inf, an int outside int64, or a value JSON cannot write (the caller
            names the document and field).
    """
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(f"integer {v} does not fit a 64-bit integer column (store it as a string)")
        return v
    if t is float:
        if not math.isfinite(v):
            raise ValueError(f"float {v!r} is not allowed (NaN and inf are not JSON numbers)")
        return v
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return normalize_value(int(v))
    if isinstance(v, (float, np.floating)):
        return normalize_value(float(v))
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, _dt.date):  # datetime and date (a datetime is a date)
        return v
    if hasattr(v, "isoformat"):
        return str(v.isoformat())
    if isinstance(v, np.ndarray):
        return normalize_value(v.tolist())
    if isinstance(v, (list, tuple)):
        if not v:
            return _EmptyList()
        if all(type(x) is str or x is None for x in v):
            return list(v)
    elif not isinstance(v, Mapping) and hasattr(v, "tolist"):
        return normalize_value(v.tolist())
    elif not isinstance(v, Mapping):
        return str(v)
    return JsonText(json.dumps(v, ensure_ascii=False, allow_nan=False, default=_json_default))


def normalize_metadata(extra: Mapping[Any, Any]) -> dict[str, Any]:
    """:func:`normalize_value` of every value, keys as JSON writes them.

    Raises:
        ValueError: naming the field (``"field 'x': ..."``).
    """
    out: dict[str, Any] = {}
    for k, v in extra.items():
        key = _json_key(k)
        try:
            out[key] = normalize_value(v)
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"metadata field {key!r}: {e}") from None
    return out


def value_kind(v: Any) -> str | None:
    """The column type name of a normalised value (None for ``None`` and ``[]``, which fit any)."""
    t = type(v)
    if t is str:
        return "string"
    if t is int:
        return "int64"
    if t is float:
        return "float64"
    if t is bool:
        return "bool"
    if t is JsonText:
        return "json"
    if v is None or t is _EmptyList:
        return None
    if t is list:
        return "list<string>"
    if isinstance(v, _dt.datetime):
        return "timestamp" if v.tzinfo is None else "timestamp[UTC]"
    if isinstance(v, _dt.date):
        return "date"
    raise TypeError(f"not a normalised metadata value: {v!r}")


@dataclass(frozen=True)
class FirstSeen:
    """Where a field first had a value of some type: document id, 0-based position in the
    corpus, and the record's file and line (``line`` as :class:`CorpusError` counts)."""

    doc_id: str
    position: int
    path: str | None
    line: int

    def describe(self) -> str:
        where = f"{self.path} line {self.line}" if self.path else f"record {self.line}"
        return f"document {self.doc_id!r} (position {self.position}, {where})"


class MetadataColumns:
    """Infers the metadata column types of one build and turns each shard's records into columns.

    Args:
        on_conflict: ``"error"`` (a build: mixed types are a :class:`CorpusError`) or ``"json"``
            (upgrading a format-1 index: a field with mixed types becomes a JSON column, listed
            in :attr:`json_fallbacks`).
        schema: types already fixed (a later generation's adds must match them).
    """

    def __init__(self, *, on_conflict: str = "error", schema: Mapping[str, str] | None = None) -> None:
        if on_conflict not in ("error", "json"):
            raise ValueError(f"on_conflict must be 'error' or 'json', got {on_conflict!r}")
        self.on_conflict = on_conflict
        self.kinds: dict[str, str | None] = dict(schema or {})  # field -> type name (None: only nulls so far)
        self._first: dict[str, dict[str, FirstSeen]] = {}
        self.json_fallbacks: list[str] = []
        self._position = 0

    @property
    def schema(self) -> dict[str, str | None]:
        """field -> type name (``None``: every value so far was null), in first-seen order."""
        return dict(self.kinds)

    def _conflict(self, name: str, kind: str, have: str, doc: Any, pos: int) -> None:
        seen = self._first.get(name, {}).get(have)
        this = FirstSeen(doc.id, pos, doc.path, doc.line)
        if self.on_conflict == "json":
            self.kinds[name] = "json"
            if name not in self.json_fallbacks:
                self.json_fallbacks.append(name)
            return
        first = seen.describe() if seen is not None else "an earlier generation"
        raise CorpusError(f"metadata field {name!r} has mixed types in one build: {have} (first in {first}) and "
                          f"{kind} (first in {this.describe()})", path=doc.path, line=doc.line, field=name)

    def columns(self, docs: Sequence[Any]) -> tuple[pa.StructArray, pa.Array]:
        """The ``metadata`` struct and ``metadata_nulls`` columns of one shard's documents.

        Args:
            docs: records with ``id``, ``path``, ``line`` and ``metadata`` (a dict of normalised
                values, :func:`normalize_metadata`), in corpus order; positions continue from the
                previous call.

        Raises:
            CorpusError: a field whose values have two types (``on_conflict="error"``).
        """
        n = len(docs)
        values: dict[str, list[Any]] = {}
        nulls: list[list[str] | None] = [None] * n
        kinds = self.kinds
        for i, d in enumerate(docs):
            md = d.metadata
            if not md:
                continue
            for name, v in md.items():
                col = values.get(name)
                if col is None:
                    col = values[name] = [None] * n
                    kinds.setdefault(name, None)
                col[i] = v
                if v is None:
                    if nulls[i] is None:
                        nulls[i] = []
                    nulls[i].append(name)  # type: ignore[union-attr]
                    continue
                kind = value_kind(v)
                if kind is None:
                    continue
                have = kinds[name]
                if have != kind:
                    if have is None:
                        kinds[name] = kind
                    elif have != "json" or self.on_conflict != "json":
                        self._conflict(name, kind, have, d, self._position + i)
                        continue
                firsts = self._first.setdefault(name, {})
                if kind not in firsts:
                    firsts[kind] = FirstSeen(d.id, self._position + i, d.path, d.line)
        self._position += n
        children, fields = [], []
        for name, kind in kinds.items():
            col = values.get(name)
            children.append(_column(col if col is not None else [None] * n, kind))
            fields.append(pa.field(name, children[-1].type))
        struct = pa.StructArray.from_arrays(children, fields=fields) if fields else \
            pa.array([{}] * n, pa.struct([]))
        return struct, pa.array(nulls, NULLS_TYPE)


def _to_json_text(v: Any) -> str | None:
    if v is None or type(v) is JsonText:
        return v
    if isinstance(v, (_dt.date, _dt.datetime)):
        return json.dumps(v.isoformat())
    return json.dumps(v, ensure_ascii=False, allow_nan=False)


def _column(vals: list[Any], kind: str | None) -> pa.Array:
    if kind is None:
        if any(type(v) is _EmptyList for v in vals):  # only [] (and nulls) so far: kept as empty lists,
            return pa.array([None if v is None else [] for v in vals], KIND_TYPES["list<string>"])  # typed later
        return pa.nulls(len(vals))
    if kind == "json":
        return pa.ExtensionArray.from_storage(JSON_TYPE, pa.array([_to_json_text(v) for v in vals], pa.large_string()))
    if kind == "list<string>":
        vals = [None if v is None else list(v) for v in vals]
    return pa.array(vals, KIND_TYPES[kind])


def shard_field_types(struct: pa.StructArray) -> dict[str, str | None]:
    """A shard's metadata field -> type name (:func:`type_name`); a list column whose values are
    all empty or null (a field of only ``[]`` in the shard) is None: it fits any list or JSON type."""
    import pyarrow.compute as pc

    out: dict[str, str | None] = {}
    for i, f in enumerate(struct.type):
        name = type_name(f.type)
        if pa.types.is_large_list(f.type):
            lengths = pc.list_value_length(struct.field(i))
            if (pc.max(lengths).as_py() or 0) == 0:
                name = None
        out[f.name] = name
    return out


def type_name(typ: pa.DataType) -> str | None:
    """The type name (see :data:`KIND_TYPES`) of a stored metadata column type (None: null)."""
    if pa.types.is_null(typ):
        return None
    for name, t in KIND_TYPES.items():
        if typ == t:
            return name
    raise ValueError(f"unknown metadata column type {typ}")


def _decode_json(vals: list[Any]) -> list[Any]:
    loads = json.loads
    out: list[Any] = []
    for v in vals:
        if v is None:
            out.append(None)
        elif v == "{}":
            out.append({})
        elif v == "[]":
            out.append([])
        else:
            out.append(loads(v))
    return out


def column_pylist(arr: pa.Array) -> list[Any]:
    """One metadata column's values as the Python values ``fetch`` returns (module table):
    one ``to_pylist`` per column; JSON text decoded only for the JSON column type."""
    typ = arr.type
    if isinstance(typ, pa.BaseExtensionType):
        return _decode_json(arr.storage.to_pylist())
    vals = arr.to_pylist()
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        return [None if v is None else v.isoformat() for v in vals]
    return vals


def metadata_dicts(struct: pa.Array, nulls: pa.Array | None) -> list[dict[str, Any]]:
    """The metadata dicts of ``len(struct)`` rows: each row's non-null fields (in column order)
    and the fields it gave as ``None``; every dict a new object.

    Args:
        struct: the ``metadata`` struct column (a ``StructArray`` or ``ChunkedArray``).
        nulls: the ``metadata_nulls`` column, same length (None: no row has explicit nulls).
    """
    if isinstance(struct, pa.ChunkedArray):
        struct = struct.combine_chunks()
    if isinstance(nulls, pa.ChunkedArray):
        nulls = nulls.combine_chunks()
    n = len(struct)
    typ = struct.type
    if typ.num_fields == 0:
        out: list[dict[str, Any]] = [{} for _ in range(n)]
    else:
        names = [typ.field(i).name for i in range(typ.num_fields)]
        children = [struct.field(i) for i in range(typ.num_fields)]
        cols = [column_pylist(c) for c in children]
        out = [dict(zip(names, vals)) for vals in zip(*cols)]
        for name, child in zip(names, children):  # drop the nulls (missing fields) again
            if child.null_count:
                for i in np.flatnonzero(child.is_null().to_numpy(zero_copy_only=False)).tolist():
                    del out[i][name]
    if nulls is not None and nulls.null_count != len(nulls):
        for i, row in enumerate(nulls.to_pylist()):
            if row:
                for name in row:
                    out[i][name] = None
    return out


def combine_schema(schemas: Iterable[Mapping[str, str | None]]) -> dict[str, str | None]:
    """Union of per-shard metadata schemas (a null-only field takes another shard's type)."""
    out: dict[str, str | None] = {}
    for s in schemas:
        for k, v in s.items():
            if out.get(k) is None:
                out[k] = v
    return out
