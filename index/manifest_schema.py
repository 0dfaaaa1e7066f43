"""Parsing and validating a generation manifest (and the other JSON files of an index) with limits.

An index may come from an untrusted source, and its checksums prove nothing when whoever wrote the
files also rewrote the manifest. So the JSON is parsed with limits (size — checked by the caller —,
nesting depth, digits of a number, no ``NaN`` / ``Infinity`` / overflowing floats, no duplicate
keys) and the manifest is checked against a schema (type and range of every field the reader
uses) before anything in it is used. Every violation is an
:class:`~retriever.index.errors.IndexFormatError` naming the file and the field, e.g.
``.../manifests/000001.json: field 'build_config.dense.query_prefix': a string of at most 4096
characters expected, got a str of 16777216 characters``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from .config import MAX_K1
from .errors import IndexFormatError
from .safe_open import check_rel

#: deepest nesting of arrays / objects accepted in an index's JSON files
MAX_JSON_DEPTH = 32
#: most characters of an integer literal (sign included); int64 has 19 digits
MAX_INT_CHARS = 21
#: most characters of a float literal
MAX_FLOAT_CHARS = 64
#: longest ``query_prefix`` / ``document_prefix`` (characters)
MAX_PREFIX_CHARS = 4096
#: longest free-form string (names, factory strings, paths recorded for information)
MAX_STR = 4096
#: widest dense vector
MAX_DIM = 65536
#: largest row count of a shard (row ids are u32)
MAX_ROWS = 2**32 - 1
MAX_COUNT = 2**62
MAX_FILE_BYTES = 2**50
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _Refused(Exception):
    """A JSON value refused by a parse hook (turned into an IndexFormatError with the file)."""


def _parse_int(s: str) -> int:
    if len(s) > MAX_INT_CHARS:
        raise _Refused(f"an integer of {len(s)} digits")
    return int(s)


def _parse_float(s: str) -> float:
    if len(s) > MAX_FLOAT_CHARS:
        raise _Refused(f"a number of {len(s)} characters")
    v = float(s)
    if not math.isfinite(v):
        raise _Refused(f"the number {s[:32]} (overflows to {v})")
    return v


def _parse_constant(s: str) -> Any:
    raise _Refused(f"{s} (not a JSON number)")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Refused(f"duplicate key {k[:64]!r}")
            seen.add(k)
    return d


def json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest nesting of arrays and objects in JSON ``raw`` (brackets inside strings skipped),
    counted up to the first level above ``limit``. One pass over the brackets, quotes and
    backslashes (no copy of the document)."""
    depth = deepest = 0
    in_str = escaped = False
    for m in _TOKENS.finditer(raw):
        c = m.group()
        if in_str:
            if escaped:
                escaped = False
            elif c == b"\\":
                escaped = True
            elif c == b'"':
                in_str = False
            continue
        if c == b'"':
            in_str = True
        elif c in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


_TOKENS = re.compile(rb'[\[\]{}"\\]')


def parse_json_limited(path: Path | str, raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse one JSON document of an index with limits (the caller bounds its size).

    Raises:
        IndexFormatError: not UTF-8, not JSON, nested deeper than ``max_depth``, an integer of
            more than :data:`MAX_INT_CHARS` characters, ``NaN`` / ``Infinity`` or a float that
            overflows, a duplicate key (names the file).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IndexFormatError(f"{path}: not valid UTF-8 ({e})") from None
    depth = json_depth(raw, max_depth)
    if depth > max_depth:
        raise IndexFormatError(f"{path}: JSON nested more than {max_depth} levels deep")
    try:
        obj = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                         object_pairs_hook=_pairs)
        # a "\ud800" escape decodes to a lone surrogate, which no path, digest or message can encode
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return obj
    except UnicodeEncodeError as e:
        raise IndexFormatError(f"{path}: JSON string holds a lone surrogate escape ({e.object[e.start:e.end]!r})") from None
    except _Refused as e:
        raise IndexFormatError(f"{path}: JSON value refused: {e}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise IndexFormatError(f"{path}: not valid JSON ({e})") from None


def _nesting(obj: Any, limit: int) -> int:
    """Deepest nesting of lists and dicts in ``obj``, counted up to the first level above ``limit``."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            vals: Any = o.values()
        elif isinstance(o, list):
            vals = o
        else:
            continue
        if d > deepest:
            deepest = d
            if deepest > limit:
                return deepest
        stack.extend((v, d + 1) for v in vals if isinstance(v, (dict, list)))
    return deepest


def parse_own_json(path: Path | str, raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """:func:`parse_json_limited` for JSON this library has just serialised (a writer checking
    what it is about to write): the same limits and errors, with the nesting measured on the
    parsed value (the serialiser bounds it by Python's recursion limit) instead of by a scan of
    the bytes before parsing, which is there for untrusted files and costs more than the parse.

    Raises:
        IndexFormatError: as :func:`parse_json_limited`.
    """
    try:
        obj = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                         object_pairs_hook=_pairs)
    except _Refused as e:
        raise IndexFormatError(f"{path}: JSON value refused: {e}") from None
    except (ValueError, RecursionError) as e:
        raise IndexFormatError(f"{path}: not valid JSON ({e})") from None
    if _nesting(obj, max_depth) > max_depth:
        raise IndexFormatError(f"{path}: JSON nested more than {max_depth} levels deep")
    return obj


# ---------------------------------------------------------------------------------------------
# schema checks: each takes (path, field name, value) and raises naming both

def _fail(path: Path | str, field: str, expected: str, value: Any) -> None:
    if isinstance(value, str):
        got = f"a str of {len(value)} characters" if len(value) > 64 else repr(value)
    elif isinstance(value, (dict, list)):
        got = f"a {type(value).__name__} of {len(value)} entries"
    else:
        got = repr(value)[:80]
    raise IndexFormatError(f"{path}: field {field!r}: {expected} expected, got {got}")


def _int(path: Path | str, field: str, v: Any, lo: int = 0, hi: int = MAX_COUNT, *, null: bool = False) -> None:
    if v is None and null:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        _fail(path, field, f"an integer in [{lo}, {hi}]" + (" or null" if null else ""), v)


def _num(path: Path | str, field: str, v: Any, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
          and (v > lo if lo_open else v >= lo) and v <= hi)
    if not ok:
        _fail(path, field, f"a number in {'(' if lo_open else '['}{lo}, {hi}]", v)


def _str(path: Path | str, field: str, v: Any, max_len: int = MAX_STR, *, null: bool = False,
         choices: tuple[str, ...] | None = None) -> None:
    if v is None and null:
        return
    if not isinstance(v, str) or len(v) > max_len or (choices is not None and v not in choices):
        what = f"one of {list(choices)}" if choices else f"a string of at most {max_len} characters"
        _fail(path, field, what + (" or null" if null else ""), v)


def _bool(path: Path | str, field: str, v: Any) -> None:
    if not isinstance(v, bool):
        _fail(path, field, "true or false", v)


def _obj(path: Path | str, field: str, v: Any, *, null: bool = False) -> bool:
    """True when ``v`` is an object; None passes when ``null`` (returns False)."""
    if v is None and null:
        return False
    if not isinstance(v, dict):
        _fail(path, field, "an object" + (" or null" if null else ""), v)
    return True


def _opt(d: dict[str, Any], key: str, check: Callable[[Any], None]) -> None:
    if key in d:
        check(d[key])


def _dims(path: Path | str, field: str, v: Any, dim: int | None) -> None:
    hi = dim if dim is not None else MAX_DIM
    if not isinstance(v, list) or len(v) > 64:
        _fail(path, field, "a list of at most 64 integers", v)
    for i, d in enumerate(v):
        _int(path, f"{field}[{i}]", d, 1, hi)
    if any(b <= a for a, b in zip(v, v[1:])):
        _fail(path, field, "strictly ascending dimensions", v)


def _build_config(path: Path | str, bc: dict[str, Any], dim: int | None) -> None:
    f = "build_config"
    legs = bc.get("legs")
    if not isinstance(legs, list) or not 1 <= len(legs) <= 3 or any(not isinstance(x, str) for x in legs):
        _fail(path, f"{f}.legs", "a list of 1 to 3 leg names", legs)
    _opt(bc, "shard_size", lambda v: _int(path, f"{f}.shard_size", v, 1, MAX_ROWS))
    _opt(bc, "batch_size", lambda v: _int(path, f"{f}.batch_size", v, 1, 2**31))
    _opt(bc, "device", lambda v: _str(path, f"{f}.device", v, 32))
    if _obj(path, f"{f}.bm25", bc.get("bm25", {})):
        b = bc.get("bm25", {})
        _opt(b, "k1", lambda v: _num(path, f"{f}.bm25.k1", v, 0.0, MAX_K1))
        _opt(b, "b", lambda v: _num(path, f"{f}.bm25.b", v, 0.0, 1.0))
        _opt(b, "lucene_norms", lambda v: _bool(path, f"{f}.bm25.lucene_norms", v))
    if _obj(path, f"{f}.analyzer", bc.get("analyzer", {})):
        a = bc.get("analyzer", {})
        _opt(a, "lowercase", lambda v: _bool(path, f"{f}.analyzer.lowercase", v))
        _opt(a, "stopwords", lambda v: _str(path, f"{f}.analyzer.stopwords", v, choices=("lucene", "none")))
        _opt(a, "stemmer", lambda v: _str(path, f"{f}.analyzer.stemmer", v, choices=("porter", "none")))
        _opt(a, "max_token_length", lambda v: _int(path, f"{f}.analyzer.max_token_length", v, 1, 1 << 16))
    if _obj(path, f"{f}.dense", bc.get("dense", {})):
        d = bc.get("dense", {})
        _opt(d, "model", lambda v: _str(path, f"{f}.dense.model", v, null=True))
        _opt(d, "max_length", lambda v: _int(path, f"{f}.dense.max_length", v, 1, 1 << 20))
        _opt(d, "batch_size", lambda v: _int(path, f"{f}.dense.batch_size", v, 1, 1 << 20))
        _opt(d, "dtype", lambda v: _str(path, f"{f}.dense.dtype", v, choices=("float16", "float32")))
        _opt(d, "faiss_factory", lambda v: _str(path, f"{f}.dense.faiss_factory", v, 256))
        _opt(d, "normalize", lambda v: _bool(path, f"{f}.dense.normalize", v))
        _opt(d, "query_prefix", lambda v: _str(path, f"{f}.dense.query_prefix", v, MAX_PREFIX_CHARS))
        _opt(d, "document_prefix", lambda v: _str(path, f"{f}.dense.document_prefix", v, MAX_PREFIX_CHARS))
        _opt(d, "matryoshka_dims", lambda v: _dims(path, f"{f}.dense.matryoshka_dims", v, dim))
        _opt(d, "mrl_trained", lambda v: _bool(path, f"{f}.dense.mrl_trained", v))
        _opt(d, "rotation_sample", lambda v: _int(path, f"{f}.dense.rotation_sample", v, 1, MAX_COUNT))
        _opt(d, "precision", lambda v: _str(path, f"{f}.dense.precision", v, 32))
    if _obj(path, f"{f}.sparse", bc.get("sparse", {})):
        s = bc.get("sparse", {})
        _opt(s, "model", lambda v: _str(path, f"{f}.sparse.model", v, null=True))
        for key in ("doc_max_length", "query_max_length"):
            _opt(s, key, lambda v, key=key: _int(path, f"{f}.sparse.{key}", v, 3, 1 << 20))
        _opt(s, "batch_size", lambda v: _int(path, f"{f}.sparse.batch_size", v, 1, 1 << 20))
        _opt(s, "n_postings", lambda v: _int(path, f"{f}.sparse.n_postings", v, 0, MAX_COUNT))
        _opt(s, "block_size", lambda v: _int(path, f"{f}.sparse.block_size", v, 1, MAX_ROWS))
        _opt(s, "summary_energy", lambda v: _num(path, f"{f}.sparse.summary_energy", v, 0.0, 1.0, lo_open=True))


def _model(path: Path | str, field: str, m: Any) -> None:
    if not _obj(path, field, m, null=True):
        return
    _opt(m, "path", lambda v: _str(path, f"{field}.path", v, null=True))
    _opt(m, "name", lambda v: _str(path, f"{field}.name", v, 256))
    _opt(m, "precomputed", lambda v: _bool(path, f"{field}.precomputed", v))
    _opt(m, "dim", lambda v: _int(path, f"{field}.dim", v, 1, MAX_DIM))
    _opt(m, "vocab_size", lambda v: _int(path, f"{field}.vocab_size", v, 1, 2**31))
    for key in ("pooling", "activation"):
        _opt(m, key, lambda v, key=key: _str(path, f"{field}.{key}", v, 64))
    if "sha256" in m:
        h = m["sha256"]
        if not isinstance(h, dict) or len(h) > 64:
            _fail(path, f"{field}.sha256", "an object of at most 64 weight files", h)
        for name, digest in h.items():
            _str(path, f"{field}.sha256 key", name, 255)
            if not isinstance(digest, str) or not _HEX64.match(digest):
                _fail(path, f"{field}.sha256[{name[:64]!r}]", "a SHA-256 hex digest", digest)


def validate_manifest(path: Path | str, m: dict[str, Any], *, known_files: Mapping[str, Any] | None = None) -> None:
    """Check the types and ranges of every manifest field the reader uses (the format is
    described in ``docs/FORMAT.md``); fields it does not know are left alone.

    Args:
        known_files: the ``files`` of a manifest validated already: an entry equal to its entry
            there is not checked again (a commit's parent lists most of the new one's files).

    Raises:
        IndexFormatError: the first violation, naming the file, the field and the value.
    """
    for key in ("build_config", "stats", "build", "metadata_schema", "files", "models"):
        if key != "models" or key in m:
            _obj(path, key, m.get(key))
    if not isinstance(m.get("shards"), list):
        _fail(path, "shards", "a list", m.get("shards"))
    _int(path, "generation", m.get("generation"), 1, 10**12 - 1)
    _opt(m, "created", lambda v: _str(path, "created", v, 64))
    _opt(m, "fusion", lambda v: _obj(path, "fusion", v, null=True))
    st = m["stats"]
    _opt(st, "n_docs", lambda v: _int(path, "stats.n_docs", v, 0, MAX_COUNT))
    _opt(st, "n_terms", lambda v: _int(path, "stats.n_terms", v, 0, MAX_ROWS))
    _opt(st, "sum_dl", lambda v: _int(path, "stats.sum_dl", v, 0, MAX_COUNT))
    _opt(st, "dense_dim", lambda v: _int(path, "stats.dense_dim", v, 1, MAX_DIM))
    _opt(st, "dense_dtype", lambda v: _str(path, "stats.dense_dtype", v, choices=("float16", "float32")))
    _opt(st, "sparse_scale", lambda v: _num(path, "stats.sparse_scale", v, 0.0, 1e30, lo_open=True))
    _opt(st, "sparse_vocab_size", lambda v: _int(path, "stats.sparse_vocab_size", v, 1, 2**31))
    _opt(st, "sparse_nnz", lambda v: _int(path, "stats.sparse_nnz", v, 0, MAX_COUNT))
    for key in ("n_live", "n_deleted"):
        _opt(st, key, lambda v, key=key: _int(path, f"stats.{key}", v, 0, MAX_COUNT))
    vocab = m.get("vocab")
    if vocab is not None:
        if not isinstance(vocab, list) or not 1 <= len(vocab) <= 1_000_000:
            _fail(path, "vocab", "a list of vocabulary files", vocab)
        for i, rel in enumerate(vocab):
            _str(path, f"vocab[{i}]", rel, 1024)
            check_rel(rel, str(path))
    dim = st.get("dense_dim")
    _build_config(path, m["build_config"], dim)
    # 'build' is information for people (timings, counts): any JSON object of bounded depth
    for key, v in m["metadata_schema"].items():
        _str(path, "metadata_schema key", key, 1024)
        _str(path, f"metadata_schema[{key[:64]!r}]", v, 256, null=True)
    if "models" in m:
        for leg, info in m["models"].items():
            _model(path, f"models.{leg[:16]}", info)
    files = m["files"]
    known = known_files if known_files is not None else {}
    for rel, info in files.items():
        if known.get(rel) == info:
            continue
        check_rel(rel, str(path))
        if not isinstance(info, dict):
            _fail(path, f"files[{rel!r}]", "an object {bytes, sha256}", info)
        _int(path, f"files[{rel!r}].bytes", info.get("bytes"), 0, MAX_FILE_BYTES)
        _str(path, f"files[{rel!r}].sha256", info.get("sha256"), 128)  # compared by verify
    for i, s in enumerate(m["shards"]):
        f = f"shards[{i}]"
        _obj(path, f, s)
        _str(path, f"{f}.dir", s.get("dir"), 1024)
        check_rel(s["dir"], str(path))
        _int(path, f"{f}.rows", s.get("rows"), 0, MAX_ROWS)
        for key in ("n_terms", "nnz", "sparse_nnz", "bm25_terms"):
            _opt(s, key, lambda v, key=key: _int(path, f"{f}.{key}", v, 0, MAX_COUNT))
        _opt(s, "stats", lambda v: _str(path, f"{f}.stats", v, 1024))
        _opt(s, "deletes", lambda v: _str(path, f"{f}.deletes", v, 1024, null=True))
    mat = m.get("matryoshka")
    if _obj(path, "matryoshka", mat, null=True):
        _opt(mat, "dims", lambda v: _dims(path, "matryoshka.dims", v, dim))
        _opt(mat, "rotation", lambda v: _str(path, "matryoshka.rotation", v, 1024, null=True))
        _opt(mat, "mrl_trained", lambda v: _bool(path, "matryoshka.mrl_trained", v))
        _opt(mat, "rotation_sample_rows", lambda v: _int(path, "matryoshka.rotation_sample_rows", v, 0, MAX_COUNT))
        if mat.get("rotation") is not None and mat["rotation"] not in files:
            _fail(path, "matryoshka.rotation", "a file listed in 'files'", mat["rotation"])
