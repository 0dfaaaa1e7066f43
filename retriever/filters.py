"""Metadata filters: a ``pyarrow.compute`` expression or a JSON-able dict, compiled into one allow
mask per shard by Arrow compute over the shard's typed metadata columns (``docs.arrow``).

Two forms (see ``docs/FILTERS.md``):

- an Arrow expression, e.g. ``(pc.field("year") >= 2020) & pc.field("lang").isin(["en", "de"])``
  (Arrow's own rules; :func:`list_contains` for list-of-strings fields);
- a dict in a Mongo-like form, e.g. ``{"year": {"$gte": 2020}, "lang": {"$in": ["en", "de"]}}``:
  field conditions (a bare value means ``$eq``; several fields or operators are ANDed) and the
  logical ``$and`` / ``$or`` (lists of dicts) and ``$not`` (a dict), at the top level or, for
  ``$not``, inside a field's operators.

Null semantics (SQL's): a document without the field (or with an explicit ``null``) fails every
comparison on it, under ``$not`` and ``$ne`` / ``$nin`` too: comparisons yield null there, Kleene
logic keeps null through ``$not`` and through ``$and`` with a true side, and a null result does not
pass. ``$exists`` is the one operator that looks at nulls: ``{"$exists": true}`` passes documents
holding a non-null value, ``{"$exists": false}`` the others (missing field and explicit null alike:
the columns do not tell them apart), and its result is never null (so ``$not`` inverts it).

Values are checked against the index's column types (``IndexReader.metadata_schema``): numbers
for ``int64`` / ``float64`` columns (an int and a float compare as numbers), strings for ``string``,
booleans for ``bool``, ISO-8601 strings (or ``datetime`` / ``date`` objects) for ``timestamp`` and
``date`` columns, strings for ``list<string>`` columns, where a value matches a document whose list
contains it (``$in``: contains any of the values; ``$ne`` / ``$nin``: contains none of them). JSON
columns take ``$exists`` only.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from retriever.index.errors import QueryError
from retriever.index.metadata import JSON_TYPE, KIND_TYPES

from .shards import IndexReader, Shard

#: comparison operators of the dict form (a field's condition)
FIELD_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$not")
#: logical operators of the dict form (at the top level of a condition)
LOGICAL_OPERATORS = ("$and", "$or", "$not")
_COMPARE = {"$eq": pc.equal, "$ne": pc.not_equal, "$gt": pc.greater, "$gte": pc.greater_equal,
            "$lt": pc.less, "$lte": pc.less_equal}
#: operators a list<string> field takes (a scalar matches when the list contains it)
_LIST_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$exists", "$not")
_LIST_TYPE = KIND_TYPES["list<string>"]
_NULL_BOOL = pc.scalar(pa.scalar(None, pa.bool_()))
LIST_CONTAINS = "retriever_list_contains"
#: the column type of a field when no schema is given (values keep their own Arrow types)
_UNTYPED = "untyped"

Filter = Any  # None | pc.Expression | Mapping[str, Any]


def _list_contains_kernel(ctx: Any, lists: pa.Array, needles: Any) -> pa.Array:
    """UDF body of :data:`LIST_CONTAINS`: per row, whether the list holds any of ``needles``
    (a list scalar, or an array whose first row is the needle list); null where the list is null.
    Arrow compute matches the values (``is_in``); a prefix sum over the hits
    read at the list offsets counts each row's."""
    if isinstance(needles, pa.Scalar):
        values = needles.values
    else:
        values = needles[0].values
    if values is None:
        values = pa.array([], pa.large_string())
    offs = lists.offsets.to_numpy().astype(np.int64)
    flat = lists.values.slice(int(offs[0]), int(offs[-1] - offs[0]))  # this (sliced) array's values, no copy
    hit = pc.fill_null(pc.is_in(flat, value_set=values), False).to_numpy(zero_copy_only=False)
    offs -= offs[0]
    cum = np.zeros(len(hit) + 1, dtype=np.int64)
    np.cumsum(hit, out=cum[1:])
    out = cum[offs[1:]] > cum[offs[:-1]]
    return pa.array(out, mask=lists.is_null().to_numpy(zero_copy_only=False) if lists.null_count else None)


def _register_udfs() -> None:
    """Register :data:`LIST_CONTAINS` in Arrow's function registry (once per process)."""
    try:
        pc.get_function(LIST_CONTAINS)
        return
    except (pa.ArrowKeyError, KeyError):
        pass
    try:
        pc.register_scalar_function(
            _list_contains_kernel, LIST_CONTAINS,
            {"summary": "list contains any of the needles",
             "description": "true where the list holds one of the needles; null where the list is null"},
            {"lists": _LIST_TYPE, "needles": _LIST_TYPE}, pa.bool_())
    except pa.ArrowKeyError:  # another thread registered it meanwhile
        pass


_register_udfs()


def list_contains(field: str | pc.Expression, values: str | Sequence[str]) -> pc.Expression:
    """Expression: the ``list<string>`` field holds ``values`` (one string) or any of them (a
    sequence); null (fails) where the field is null. For the expression form of a filter.

    Raises:
        QueryError: a value that is not a string.
    """
    vals = [values] if isinstance(values, str) else list(values)
    for v in vals:
        if not isinstance(v, str):
            raise QueryError(f"list_contains: values must be strings, got {type(v).__name__} {v!r}")
    ref = pc.field(field) if isinstance(field, str) else field
    return pc.Expression._call(LIST_CONTAINS, [ref, pc.scalar(pa.scalar(vals, _LIST_TYPE))])


# ---------------------------------------------------------------------------------------- parsing
def _describe_fields(schema: Mapping[str, str | None]) -> str:
    if not schema:
        return "(this index has no metadata fields)"
    return ", ".join(f"{k} ({v or 'null'})" for k, v in schema.items())


def _value_type(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if isinstance(v, _dt.datetime):
        return "datetime"
    if isinstance(v, _dt.date):
        return "date"
    if v is None:
        return "null"
    return type(v).__name__


def _mismatch(field: str, kind: str, v: Any, want: str) -> QueryError:
    return QueryError(f"filter field {field!r} is {kind}, got {_value_type(v)} value {v!r} (expected {want})")


def _scalar(field: str, kind: str | None, v: Any) -> pa.Scalar:
    """``v`` as an Arrow scalar comparable with a column of type ``kind``.

    Raises:
        QueryError: a value of another type (names the field, the column type and the value's).
    """
    if v is None:
        raise QueryError(f"filter field {field!r}: null is not a value to compare with (a missing field "
                         f"fails every comparison); use {{'$exists': false}}")
    if isinstance(v, (np.generic,)):
        v = v.item()
    if kind is None or kind == _UNTYPED:  # null-only column (any comparison fails) or no schema
        return pa.scalar(v)
    if kind in ("int64", "float64"):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _mismatch(field, kind, v, "a number")
        if isinstance(v, float) and not math.isfinite(v):
            raise QueryError(f"filter field {field!r}: {v!r} is not a comparable number")
        if kind == "int64" and isinstance(v, int):
            if not -(1 << 63) <= v < (1 << 63):
                raise QueryError(f"filter field {field!r}: integer {v} does not fit int64")
            return pa.scalar(v, pa.int64())
        return pa.scalar(float(v), pa.float64())
    if kind == "bool":
        if not isinstance(v, bool):
            raise _mismatch(field, kind, v, "true or false")
        return pa.scalar(v, pa.bool_())
    if kind in ("string", "list<string>"):
        if not isinstance(v, str):
            raise _mismatch(field, kind, v, "a string")
        return pa.scalar(v, pa.large_string())
    if kind in ("timestamp", "timestamp[UTC]"):
        ts = _to_datetime(field, kind, v)
        return pa.scalar(ts, KIND_TYPES[kind])
    if kind == "date":
        if isinstance(v, _dt.datetime) or not isinstance(v, (str, _dt.date)):
            raise _mismatch(field, kind, v, "an ISO date string such as '2020-01-31'")
        if isinstance(v, str):
            try:
                v = _dt.date.fromisoformat(v)
            except ValueError:
                raise QueryError(f"filter field {field!r} is date, got {v!r}: not an ISO date "
                                 f"(expected e.g. '2020-01-31')") from None
        return pa.scalar(v, pa.date32())
    raise QueryError(f"filter field {field!r} is {kind}: it takes $exists only")


def _to_datetime(field: str, kind: str, v: Any) -> _dt.datetime:
    """An ISO string / datetime / date as the column's datetime: naive for ``timestamp`` (an aware
    value converted to UTC), UTC for ``timestamp[UTC]`` (a naive value taken as UTC)."""
    if isinstance(v, str):
        try:
            ts = _dt.datetime.fromisoformat(v)
        except ValueError:
            raise QueryError(f"filter field {field!r} is {kind}, got {v!r}: not an ISO-8601 date or "
                             f"datetime (expected e.g. '2020-01-31' or '2020-01-31T12:00:00')") from None
    elif isinstance(v, _dt.datetime):
        ts = v
    elif isinstance(v, _dt.date):
        ts = _dt.datetime(v.year, v.month, v.day)
    else:
        raise _mismatch(field, kind, v, "an ISO-8601 string")
    if kind == "timestamp":
        return ts if ts.tzinfo is None else ts.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return ts.replace(tzinfo=_dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(_dt.timezone.utc)


def _value_set(field: str, kind: str | None, op: str, vals: Any) -> tuple[pa.Array, bool]:
    """The values of ``$in`` / ``$nin`` as one Arrow array; second item: compare as float64 (an
    int column with a float among the values)."""
    if isinstance(vals, (str, bytes, Mapping)) or not isinstance(vals, (list, tuple)):
        raise QueryError(f"filter field {field!r}: {op} takes a list of values, got {_value_type(vals)} {vals!r}")
    scalars = [_scalar(field, kind, v) for v in vals]
    as_float = kind == "int64" and any(pa.types.is_floating(s.type) for s in scalars)
    if kind is None or kind == _UNTYPED:
        return pa.array([s.as_py() for s in scalars]), False
    typ = pa.float64() if as_float else (pa.large_string() if kind == "list<string>" else KIND_TYPES[kind])
    return pa.array([s.as_py() for s in scalars], typ), as_float


def _null_unless_valid(ref: pc.Expression, pred: pc.Expression) -> pc.Expression:
    """``pred`` where the field holds a value, null elsewhere (SQL: a missing value compares as
    unknown), for predicates (``is_in``) that would say false there."""
    return pc.if_else(ref.is_valid(), pred, _NULL_BOOL)


def _field_op(field: str, kind: str | None, op: str, arg: Any) -> pc.Expression:
    ref = pc.field(field)
    if op == "$exists":
        if not isinstance(arg, bool):
            raise QueryError(f"filter field {field!r}: $exists takes true or false, got {arg!r}")
        return ref.is_valid() if arg else ref.is_null()
    if op == "$not":
        if not isinstance(arg, Mapping) or not arg:
            raise QueryError(f"filter field {field!r}: $not takes a non-empty dict of operators, got {arg!r}")
        return ~_field_condition(field, kind, arg)
    if kind == "json":
        raise QueryError(f"filter field {field!r} is json: it takes $exists only, got {op}")
    if kind == "list<string>":
        if op not in _LIST_OPERATORS:
            raise QueryError(f"filter field {field!r} is list<string>: operator {op} is not supported "
                             f"(valid: {', '.join(_LIST_OPERATORS)})")
        if op in ("$eq", "$ne"):
            vals = [_scalar(field, kind, arg).as_py()]
        else:
            vals = _value_set(field, kind, op, arg)[0].to_pylist()
        hit = list_contains(ref, vals)
        return hit if op in ("$eq", "$in") else ~hit
    if op in ("$in", "$nin"):
        values, as_float = _value_set(field, kind, op, arg)
        if kind is None:
            return _NULL_BOOL
        target = ref.cast(pa.float64()) if as_float else ref
        hit = _null_unless_valid(ref, pc.is_in(target, value_set=values))
        return hit if op == "$in" else ~hit
    if isinstance(arg, (list, tuple, Mapping)):
        raise QueryError(f"filter field {field!r}: {op} takes one value, got {_value_type(arg)} {arg!r}"
                         + (" (use $in for a list of values)" if op == "$eq" else ""))
    value = _scalar(field, kind, arg)
    if kind is None:
        return _NULL_BOOL
    return _COMPARE[op](ref, pc.scalar(value))


def _field_condition(field: str, kind: str | None, cond: Any) -> pc.Expression:
    if isinstance(cond, Mapping) and any(isinstance(k, str) and k.startswith("$") for k in cond):
        parts = []
        for op, arg in cond.items():
            if op not in FIELD_OPERATORS:
                raise QueryError(f"filter field {field!r}: unknown operator {op!r}; valid: "
                                 f"{', '.join(FIELD_OPERATORS)}")
            parts.append(_field_op(field, kind, op, arg))
        return _all(parts)
    if isinstance(cond, Mapping):
        raise QueryError(f"filter field {field!r}: a condition dict must hold operators "
                         f"({', '.join(FIELD_OPERATORS)}), got keys {list(cond)}")
    return _field_op(field, kind, "$eq", cond)


def _all(parts: list[pc.Expression]) -> pc.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def _condition(obj: Any, schema: Mapping[str, str | None] | None, path: str) -> pc.Expression:
    if not isinstance(obj, Mapping):
        raise QueryError(f"filter{path} must be a dict (field conditions, $and, $or, $not) or a "
                         f"pyarrow.compute.Expression, got {type(obj).__name__} {obj!r}")
    if not obj:
        return pc.scalar(True)
    parts = []
    for key, cond in obj.items():
        if not isinstance(key, str):
            raise QueryError(f"filter{path}: field names must be strings, got {key!r}")
        if key.startswith("$"):
            if key not in LOGICAL_OPERATORS:
                raise QueryError(f"filter{path}: unknown operator {key!r}; valid at this level: "
                                 f"{', '.join(LOGICAL_OPERATORS)} (field operators: {', '.join(FIELD_OPERATORS)})")
            if key == "$not":
                parts.append(~_condition(cond, schema, f"{path}.$not"))
                continue
            if isinstance(cond, (str, bytes, Mapping)) or not isinstance(cond, (list, tuple)) or not cond:
                raise QueryError(f"filter{path}: {key} takes a non-empty list of conditions, got {cond!r}")
            subs = [_condition(c, schema, f"{path}.{key}[{i}]") for i, c in enumerate(cond)]
            if key == "$and":
                parts.append(_all(subs))
            else:
                out = subs[0]
                for s in subs[1:]:
                    out = out | s
                parts.append(out)
            continue
        if schema is not None and key not in schema:
            raise QueryError(f"filter: unknown field {key!r}; fields: {_describe_fields(schema)}")
        kind = schema[key] if schema is not None else _UNTYPED
        parts.append(_field_condition(key, kind, cond))
    return _all(parts)


def parse_filter(obj: Filter, schema: Mapping[str, str | None] | None = None) -> pc.Expression:
    """A filter as a ``pyarrow.compute.Expression``.

    Args:
        obj: a ``pc.Expression`` (returned as is, its field names checked against ``schema``) or
            a dict in the form of this module's docstring (``docs/FILTERS.md``).
        schema: metadata field -> column type name (``IndexReader.metadata_schema``). With it,
            every field and value is checked and values are typed as their column (ISO strings
            as timestamps / dates). Without it, field names are not checked and values keep their
            own Arrow types.

    Returns:
        a boolean expression over the metadata fields (null = fails).

    Raises:
        QueryError: an unknown field (names it and the fields that exist), a value of another type
            than its column (names the field and both types), an unknown operator (names it and
            the valid ones), a malformed condition, nesting deeper than :data:`MAX_FILTER_DEPTH`.
    """
    if isinstance(obj, pc.Expression):
        if schema is not None:
            check_expression(obj, schema)
        return obj
    _check_nesting(obj)
    return _condition(obj, schema, "")


#: the deepest nesting of dicts and lists a filter may have (a deeper one is refused before any
#: recursive walk could exhaust Python's stack)
MAX_FILTER_DEPTH = 64


def _check_nesting(obj: Any) -> None:
    """Raise QueryError when the dict form nests dicts / lists deeper than
    :data:`MAX_FILTER_DEPTH` (an iterative walk)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_FILTER_DEPTH:
            raise QueryError(f"filter nests deeper than {MAX_FILTER_DEPTH} levels")
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, (list, tuple)) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (Mapping, list, tuple)))


def arrow_schema(schema: Mapping[str, str | None]) -> pa.Schema:
    """The Arrow schema filters are evaluated against: one column per metadata field, typed as
    its column (``json`` as its JSON text, null-only fields as ``null``)."""
    fields = []
    for name, kind in schema.items():
        typ = pa.null() if kind is None else KIND_TYPES[kind]
        fields.append(pa.field(name, pa.large_string() if typ == JSON_TYPE else typ))
    return pa.schema(fields)


def check_expression(expr: pc.Expression, schema: Mapping[str, str | None]) -> None:
    """Bind ``expr`` to the metadata schema (on an empty table) and check it yields booleans.

    Raises:
        QueryError: an unknown field (names it and the fields that exist), operands Arrow cannot
            compare (Arrow's message, with the fields' types), a non-boolean result.
    """
    empty = arrow_schema(schema).empty_table()
    try:
        out = _evaluate(expr, empty)
    except pa.ArrowInvalid as e:
        msg = str(e)
        if "No match for FieldRef" in msg:
            name = msg.split("FieldRef.Name(", 1)[-1].split(")", 1)[0] if "FieldRef.Name(" in msg else msg
            raise QueryError(f"filter: unknown field {name!r}; fields: {_describe_fields(schema)}") from None
        raise QueryError(f"filter expression {expr}: {msg.splitlines()[0]} (fields: {_describe_fields(schema)})") from None
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise QueryError(f"filter expression {expr}: {str(e).splitlines()[0]} "
                         f"(fields: {_describe_fields(schema)})") from None
    if not pa.types.is_boolean(out.type) and not pa.types.is_null(out.type):
        raise QueryError(f"filter expression {expr} yields {out.type}, not booleans")


def filter_key(obj: Filter) -> bytes | None:
    """A canonical key of a filter (equal filters, equal keys): the dict form's JSON with sorted
    keys, an expression's Arrow serialisation; None for no filter.

    Raises:
        QueryError: a filter that is neither an expression nor a JSON-able dict, or one nested
            deeper than :data:`MAX_FILTER_DEPTH`.
    """
    if obj is None:
        return None
    if isinstance(obj, pc.Expression):
        # Arrow's own serialisation of the expression (the buffer its pickle support carries; no
        # pickle is involved)
        return b"e" + bytes(obj.__reduce__()[1][0])
    if not isinstance(obj, Mapping):
        raise QueryError(f"filter must be a dict or a pyarrow.compute.Expression, got {type(obj).__name__} {obj!r}")
    _check_nesting(obj)
    try:
        return b"d" + json.dumps(obj, sort_keys=True, default=_json_default, allow_nan=True).encode()
    except (TypeError, ValueError) as e:
        raise QueryError(f"filter is not a JSON-able dict ({e})") from None


def _json_default(v: Any) -> Any:
    if isinstance(v, (_dt.date, _dt.datetime)):
        return {"$iso": v.isoformat()}
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} {v!r} is not a filter value")


# -------------------------------------------------------------------------------------- compiling
def shard_table(shard: Shard, schema: Mapping[str, str | None]) -> pa.Table:
    """The shard's metadata columns as a table of ``schema``'s fields (zero-copy children of the
    memory-mapped ``metadata`` struct; a field the shard lacks, or holds only nulls of, becomes a
    null column of the field's type; JSON columns as their text)."""
    target = arrow_schema(schema)
    col = shard.docs.column("metadata")
    have = {col.type.field(i).name for i in range(col.type.num_fields)}
    arrays = []
    for f in target:
        if f.name in have:
            child = pc.struct_field(col, f.name)
            if isinstance(child.type, pa.BaseExtensionType):
                child = pa.chunked_array([c.storage for c in child.chunks], child.type.storage_type)
            if child.type != f.type:
                if pa.types.is_large_list(child.type) and pa.types.is_large_string(f.type):
                    # a shard's column of only [] (its shard schema says null) in a JSON field: "[]"
                    child = pc.if_else(pc.is_valid(child), pa.scalar("[]", f.type), pa.scalar(None, f.type))
                else:
                    child = child.cast(f.type)
            arrays.append(child)
        else:
            arrays.append(pa.chunked_array([pa.nulls(shard.rows, f.type)], f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _evaluate(expr: pc.Expression, table: pa.Table) -> pa.ChunkedArray:
    """``expr`` projected over ``table`` by Arrow's Acero engine (one thread, rows in order)."""
    plan = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(table)),
        acero.Declaration("project", acero.ProjectNodeOptions([expr], ["m"]))])
    return plan.to_table(use_threads=False).column("m")


def compile_filter(expr: Filter, reader: IndexReader, shard_ids: Sequence[int]) -> list[np.ndarray | None]:
    """One allow mask per shard of ``shard_ids``: Arrow compute evaluates the filter over the
    shard's metadata columns (:func:`shard_table`); a null result fails.

    Args:
        expr: a ``pc.Expression`` or the dict form (parsed with the index's schema).
        reader: the opened index.
        shard_ids: positions in ``reader.shards``.

    Returns:
        per shard a uint8 array (rows,) with 1 where the document passes, or ``None`` where every
        row of the shard passes.

    Raises:
        QueryError: as :func:`parse_filter`.
    """
    schema = reader.metadata_schema
    e = parse_filter(expr, schema)
    shards = [reader.shards[sid] for sid in shard_ids]
    if not shards:
        return []
    # one Arrow pass over the shards' columns side by side (zero-copy chunks): a plan per shard
    # cost ~0.5 ms each at 10 shards
    table = pa.concat_tables([shard_table(s, schema) for s in shards])
    try:
        out = _evaluate(e, table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise QueryError(f"filter {e}: {str(err).splitlines()[0]} (on {shards[0].dir.parent})") from None
    n = sum(s.rows for s in shards)
    if pa.types.is_null(out.type) or len(out) == 0:
        flat = np.zeros(n, dtype=np.uint8)
    else:
        arr = out.combine_chunks() if out.num_chunks != 1 else out.chunk(0)
        flat = pc.fill_null(arr, False).to_numpy(zero_copy_only=False).view(np.uint8)
        if len(flat) != n:  # a literal (the empty filter) comes back as one value
            flat = np.broadcast_to(flat, n)
    masks: list[np.ndarray | None] = []
    start = 0
    for s in shards:
        m = flat[start:start + s.rows]
        start += s.rows
        masks.append(None if m.all() else np.array(m, dtype=np.uint8))  # a copy per shard
    return masks
