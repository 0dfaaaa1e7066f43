"""Corpus, query and qrels readers.

Corpora stream as :class:`Document` records, each carrying its provenance (file and line) so that
errors name where the bad input is. Supported: a BEIR folder (``corpus.jsonl`` or
``corpus.jsonl.gz``), JSONL(.gz), Parquet, CSV/TSV (header row), and Python iterables of dicts.
A record needs an id (``_id``, or ``id`` / ``docid``) and a text (``text``, or ``contents``);
``title`` is optional; every other field is metadata (typed columns, see :mod:`retriever.index.metadata`).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from .errors import CorpusError
from .metadata import normalize_metadata

ID_FIELDS = ("_id", "id", "docid")
TEXT_FIELDS = ("text", "contents")


class Document(NamedTuple):
    """One corpus record (immutable). ``metadata``: the other fields, values normalised by
    :func:`retriever.index.metadata.normalize_metadata` (``{}`` when there are none). A named tuple rather than a frozen dataclass: it is built once per document, and a
    frozen dataclass's ``__init__`` costs about 3 µs."""

    id: str
    title: str
    text: str
    metadata: dict[str, Any]
    path: str | None
    line: int


def _check_encodable(value: str, doc_id: str, name: str, path: str | None, line: int) -> None:
    """Raise :class:`CorpusError` when ``value`` cannot be stored as UTF-8 (a lone surrogate,
    e.g. from a JSON ``"\\ud800"`` escape or a ``surrogateescape``-decoded Python string)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CorpusError(f"document {doc_id!r}: {name} holds an unpaired surrogate "
                          f"{value[e.start]!r} at position {e.start} (not storable as UTF-8)",
                          path=path, line=line, field=name) from None


def to_document(rec: Any, path: str | None, line: int) -> Document:
    """Validate one raw record (a mapping) and turn it into a :class:`Document`.

    Raises:
        CorpusError: not a mapping; missing/empty/non-string id; missing text; non-string
            title or text; metadata that cannot be written as JSON (NaN included).
    """
    if type(rec) is dict:  # fast path: a plain, valid {_id, text[, title]} record
        doc_id = rec.get("_id")
        text = rec.get("text")
        title = rec.get("title", "")
        if (type(doc_id) is str and type(text) is str and type(title) is str
                and len(rec) == (3 if "title" in rec else 2) and doc_id.strip()
                and "\x00" not in doc_id and "\x00" not in text and "\x00" not in title
                and doc_id.isascii() and text.isascii() and title.isascii()):
            return Document(doc_id, title, text, {}, path, line)
    if not isinstance(rec, Mapping):
        raise CorpusError(f"expected a JSON object / dict, got {type(rec).__name__}", path=path, line=line)
    id_key = next((k for k in ID_FIELDS if k in rec), None)
    if id_key is None:
        raise CorpusError("missing document id (expected one of '_id', 'id', 'docid')", path=path,
                          line=line, field="_id")
    doc_id = rec[id_key]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise CorpusError(f"document id must be a string, got {doc_id!r}", path=path, line=line, field=id_key)
    doc_id = str(doc_id)
    if not doc_id.strip():
        raise CorpusError(f"document id is empty: {doc_id!r}", path=path, line=line, field=id_key)
    text_key = next((k for k in TEXT_FIELDS if k in rec), None)
    if text_key is None:
        raise CorpusError(f"document {doc_id!r} has no 'text' field", path=path, line=line, field="text")
    text = rec[text_key]
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise CorpusError(f"document {doc_id!r}: text must be a string, got {type(text).__name__}",
                          path=path, line=line, field=text_key)
    title = rec.get("title", "")
    if title is None or (isinstance(title, float) and math.isnan(title)):
        title = ""
    if not isinstance(title, str):
        raise CorpusError(f"document {doc_id!r}: title must be a string, got {type(title).__name__}",
                          path=path, line=line, field="title")
    for name, value in ((id_key, doc_id), (text_key, text), ("title", title)):
        if "\x00" in value:
            raise CorpusError(f"document {doc_id!r}: NUL character in {name}", path=path, line=line, field=name)
        if not value.isascii():
            _check_encodable(value, doc_id, name, path, line)
    extra = {k: v for k, v in rec.items() if k not in (id_key, text_key, "title")}
    if not extra:
        return Document(doc_id, title, text, {}, path, line)
    try:
        metadata = normalize_metadata(extra)
    except ValueError as e:
        raise CorpusError(f"document {doc_id!r}: metadata is not storable ({e})", path=path,
                          line=line, field="metadata") from None
    for key, value in metadata.items():
        for s in (key, *(value if type(value) is list else (value,))):
            if isinstance(s, str) and not s.isascii():
                _check_encodable(s, doc_id, "metadata", path, line)
    return Document(doc_id, title, text, metadata, path, line)


def _open_binary(path: Path) -> io.BufferedIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for each non-blank line of a JSONL(.gz) file.

    Raises:
        CorpusError: a line that is not UTF-8 or not JSON (names the file and line).
    """
    path = Path(path)
    spath = str(path)
    try:
        with _open_binary(path) as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    s = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise CorpusError(f"not valid UTF-8 (byte {raw[e.start:e.start + 1]!r} at column {e.start + 1})",
                                      path=spath, line=lineno) from None
                if lineno == 1 and s.startswith("\ufeff"):
                    s = s[1:]  # a UTF-8 byte order mark (Windows editors write one) is not data
                if not s.strip():
                    continue
                try:
                    yield lineno, json.loads(s)
                except json.JSONDecodeError as e:
                    raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno}): {s[:80]!r}",
                                      path=spath, line=lineno) from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise CorpusError("file not found", path=spath) from None
        raise CorpusError(f"cannot read file: {e}", path=spath) from None


def read_jsonl(path: str | Path) -> Iterator[Document]:
    """Stream documents from a JSONL(.gz) corpus."""
    spath = str(path)
    for lineno, obj in iter_jsonl(path):
        yield to_document(obj, spath, lineno)


_CSV_FIELD_LIMIT = 2**31 - 1


def _decoded_lines(raw: Any, spath: str) -> Iterator[str]:
    """The lines of a binary file as text (UTF-8, a byte-order mark dropped from the first),
    line ends kept (the csv module's ``newline=""`` contract).

    Raises:
        CorpusError: a line that is not valid UTF-8 (names the line and the byte's column).
    """
    for lineno, b in enumerate(raw, start=1):
        try:
            yield b.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"not valid UTF-8 (byte {b[e.start:e.start + 1]!r} at column {e.start + 1})",
                              path=spath, line=lineno) from None


def read_csv(path: str | Path) -> Iterator[Document]:
    """Stream documents from a CSV (``,``) or TSV (``.tsv``) file with a header row."""
    path = Path(path)
    spath = str(path)
    delim = "\t" if ".tsv" in path.suffixes else ","
    try:
        raw = _open_binary(path)
    except FileNotFoundError:
        raise CorpusError("file not found", path=spath) from None
    with raw:
        # decoded line by line, so a bad byte is named at its own line (a text wrapper decodes
        # ahead in chunks); strict: a stray or unterminated quote is an error, not a field that
        # silently swallows the following rows; fields may be as long as a document (the csv
        # default is 128 KiB)
        reader = csv.DictReader(_decoded_lines(raw, spath), delimiter=delim, strict=True)
        csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
        try:
            names = reader.fieldnames or []
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise CorpusError(f"header names column(s) {dup} more than once", path=spath, line=1)
            for row in reader:
                if None in row:
                    raise CorpusError(f"row has more fields than the header ({len(reader.fieldnames or [])})",
                                      path=spath, line=reader.line_num)
                if None in row.values():
                    raise CorpusError(f"row has fewer fields than the header ({len(names)}: {names})",
                                      path=spath, line=reader.line_num)
                yield to_document(row, spath, reader.line_num)
        except csv.Error as e:
            hint = (" (an unterminated quoted field?)" if "end of data" in str(e) else
                    " (a field that starts with a double quote must be quoted whole, inner quotes doubled)"
                    if "expected after" in str(e) else "")
            raise CorpusError(f"malformed CSV: {e}{hint}", path=spath, line=reader.line_num + 1) from None


def read_parquet(path: str | Path, batch_size: int = 4096) -> Iterator[Document]:
    """Stream documents from a Parquet file (row numbers are 1-based)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spath = str(path)
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise CorpusError("file not found", path=spath) from None
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"not a readable Parquet file: {e}", path=spath) from None
    row = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        for rec in batch.to_pylist():
            row += 1
            yield to_document(rec, spath, row)


def read_iterable(records: Iterable[Mapping[str, Any]]) -> Iterator[Document]:
    """Stream documents from Python dicts (``line`` is the 1-based position)."""
    for i, rec in enumerate(records, start=1):
        yield to_document(rec, None, i)


def find_beir_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    """The first of ``names`` that is a file in ``folder`` (BEIR layout), or None."""
    for n in names:
        p = folder / n
        if p.is_file():
            return p
    return None


def read_corpus(source: str | Path | Iterable[Mapping[str, Any]]) -> Iterator[Document]:
    """Stream documents from any supported source.

    Args:
        source: a BEIR folder, a ``.jsonl``/``.jsonl.gz``/``.json``, ``.parquet``, ``.csv``/``.tsv``
            file, or an iterable of dicts.

    Raises:
        CorpusError: unknown format, missing file, or a bad record (names file and line).
    """
    if not isinstance(source, (str, Path)):
        if isinstance(source, (bytes, Mapping)) or not isinstance(source, Iterable):
            raise CorpusError(f"corpus must be a path or an iterable of dicts, got {type(source).__name__}")
        return read_iterable(source)
    path = Path(source)
    if path.is_dir():
        corpus = find_beir_file(path, ("corpus.jsonl", "corpus.jsonl.gz"))
        if corpus is None:
            raise CorpusError("folder has no corpus.jsonl or corpus.jsonl.gz (BEIR layout)", path=path)
        return read_jsonl(corpus)
    if not path.exists():
        raise CorpusError("corpus not found", path=path)
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
        return read_jsonl(path)
    if name.endswith(".parquet"):
        return read_parquet(path)
    if name.endswith((".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        return read_csv(path)
    raise CorpusError("unknown corpus format (expected a BEIR folder, .jsonl[.gz], .parquet, .csv or .tsv)",
                      path=path)


def read_queries(path: str | Path) -> dict[str, str]:
    """Read queries: BEIR ``queries.jsonl`` (``_id``, ``text``) or a TSV ``qid<TAB>text`` file.

    Returns:
        ``{query_id: text}`` in file order.

    Raises:
        CorpusError: missing file, bad line, duplicate query id.
    """
    path = Path(path)
    if path.is_dir():
        found = find_beir_file(path, ("queries.jsonl", "queries.jsonl.gz"))
        if found is None:
            raise CorpusError("folder has no queries.jsonl", path=path)
        path = found
    out: dict[str, str] = {}
    if path.name.endswith((".tsv", ".txt")):
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            raise CorpusError("queries file not found", path=path) from None
        for lineno, raw in enumerate(lines, start=1):
            try:
                s = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                raise CorpusError("not valid UTF-8", path=path, line=lineno) from None
            if not s.strip():
                continue
            qid, sep, text = s.partition("\t")
            if not sep:
                raise CorpusError("expected 'query_id<TAB>text'", path=path, line=lineno)
            qid = qid.strip()  # qrels ids are whitespace-split, so 'q1 ' could never be judged
            if not qid:
                raise CorpusError("empty query id", path=path, line=lineno, field="_id")
            if qid in out:
                raise CorpusError(f"duplicate query id {qid!r}", path=path, line=lineno, field="_id")
            out[qid] = text
        return out
    for lineno, obj in iter_jsonl(path):
        doc = to_document(obj, str(path), lineno)
        if doc.id in out:
            raise CorpusError(f"duplicate query id {doc.id!r}", path=path, line=lineno, field="_id")
        out[doc.id] = doc.text
    return out


def read_id_lines(path: str | Path) -> list[str]:
    """Document ids, one per line (UTF-8, a byte-order mark allowed; surrounding white space
    and blank lines dropped), in file order.

    Raises:
        CorpusError: missing file, or a line that is not valid UTF-8 (names the file and line).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError("ids file not found", path=path) from None
    except IsADirectoryError:
        raise CorpusError("is a folder, expected a file of ids (one per line)", path=path) from None
    out: list[str] = []
    for lineno, raw in enumerate(data.splitlines(), start=1):
        try:
            s = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
        except UnicodeDecodeError:
            raise CorpusError("not valid UTF-8", path=path, line=lineno) from None
        if s:
            out.append(s)
    return out


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read relevance judgements: BEIR TSV (``query-id corpus-id score`` with a header) or TREC
    qrels (``qid 0 docid rel``). A line with a tab is split on tabs only (so ids may hold
    spaces), any other on whitespace. A folder means BEIR ``qrels.tsv`` or ``qrels/test.tsv``.

    Returns:
        ``{query_id: {doc_id: relevance}}``.

    Raises:
        CorpusError: missing file, or a line with the wrong number of columns, an empty column or a
            non-integer grade.
    """
    path = Path(path)
    if path.is_dir():
        found = find_beir_file(path, ("qrels.tsv", "qrels/test.tsv"))
        if found is None:
            raise CorpusError("folder has no qrels.tsv or qrels/test.tsv", path=path)
        path = found
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError("qrels file not found", path=path) from None
    out: dict[str, dict[str, int]] = {}
    for lineno, raw in enumerate(data.splitlines(), start=1):
        try:
            s = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError:
            raise CorpusError("not valid UTF-8", path=path, line=lineno) from None
        # a line with tabs is split on tabs only (BEIR's TSV: an id may hold spaces), else on
        # any whitespace (TREC)
        parts = [f.strip() for f in s.split("\t")] if "\t" in s else s.split()
        if not any(parts):
            continue
        if "" in parts:
            raise CorpusError(f"empty column in a tab-separated line: {s[:80]!r}", path=path, line=lineno)
        if lineno == 1 and parts[0] in ("query-id", "query_id", "qid"):
            continue
        if len(parts) == 3:
            qid, did, rel = parts
        elif len(parts) == 4:
            qid, _, did, rel = parts
        else:
            raise CorpusError(f"expected 3 (BEIR) or 4 (TREC) columns, got {len(parts)}: {s[:80]!r}",
                              path=path, line=lineno)
        try:
            grade = int(rel)
        except ValueError:
            raise CorpusError(f"relevance grade is not an integer: {rel!r}", path=path, line=lineno) from None
        out.setdefault(qid, {})[did] = grade
    return out
