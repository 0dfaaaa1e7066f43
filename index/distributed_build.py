"""``build_index(..., executor=RayExecutor(...))``: a build spread over a Ray cluster that writes the
index a one-process build writes (same documents, ordinals, ids, term statistics and vectors).

Stages (see docs/DISTRIBUTED.md)::

    driver   plan parts: a JSONL corpus cut into byte ranges at line ends (other formats: one part per
             file), the line number at each cut counted once
    Ray Data read: one task per part parses its records (the one-process record checks) into
             Arrow blocks tagged (part, row); materialised; the first bad record in corpus order fails
             the build before any encoding
    driver   global ordinals = corpus order (parts in order, rows in order), whatever order Ray
             produced the blocks in; shards of ``shard_size`` documents, each cut into pipeline
             batches of ``batch_size`` exactly as one process cuts them
    Ray Data encode (dense / sparse legs): an ``ActorPoolStrategy`` pool of encoder actors (GPU
             when ``num_gpus_per_worker`` > 0), one shard per call, each pipeline batch encoded as
             one ``encode`` call, so vectors are bit-identical to a one-process build's
    Ray tasks, phase 1 (per shard): BM25 analysis with a fresh vocabulary (terms in first-occurrence
             order), metadata types, ids and the largest sparse weight
    driver   the global vocabulary (shards' vocabularies concatenated in shard order, first
             occurrence kept: exactly the one-process term ids), duplicate ids and mixed metadata
             types (errors naming the record), the corpus-wide sparse scale
    Ray tasks, phase 2 (per shard): docs.arrow, bm25.arrow (term ids remapped), dense.arrow /
             dense.faiss, sparse.arrow / sparse_index.arrow, written into the build's temporary
             directory on shared storage
    driver   vocab.arrow, statistics, manifest, one atomic rename (IndexWriter.commit)

A worker (task or encoder actor) that dies is retried by Ray up to ``RayExecutor.max_restarts``
times; after that the build fails with :class:`~retriever.index.errors.DistributedError` and the
temporary directory is removed: a partial index is never visible. Errors about the corpus itself
(:class:`~retriever.index.errors.CorpusError`) are raised as in a one-process build.

Not supported here (a :class:`~retriever.index.errors.ConfigError`): precomputed ``dense_vectors``
/ ``sparse_vectors`` and a fitted Matryoshka rotation (``matryoshka_dims`` without
``mrl_trained``). This module imports Ray only inside :func:`build_distributed`.
"""

from __future__ import annotations

import io
import json
import logging
import math
import pickle
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .builders import Batch, IndexOutput, ShardHandle, ShardOutput, manifest_parts
from .config import BuildConfig
from .distributed import RayExecutor
from .errors import ConfigError, CorpusError, DistributedError, RetrieverError
from .faults import FaultHook, no_faults
from .metadata import FirstSeen, MetadataColumns, value_kind
from .readers import Document, find_beir_file, read_corpus, to_document
from .writer import IndexWriter, check_target

log = logging.getLogger(__name__)

#: target bytes of one read part of an uncompressed JSONL corpus (at least one part per worker)
PART_BYTES = 32 << 20
#: records per part of a Python iterable corpus (the driver holds an iterable's records anyway)
PART_RECORDS = 50_000
DOC_SCHEMA = pa.schema([("part", pa.int64()), ("row", pa.int64()), ("id", pa.string()), ("title", pa.large_string()),
                        ("text", pa.large_string()), ("meta", pa.large_binary()), ("path", pa.string()),
                        ("line", pa.int64()), ("error", pa.large_binary())])


# ----------------------------------------------------------------------------------------- parts

def plan_parts(corpus: Any, n_workers: int, part_bytes: int = PART_BYTES) -> list[dict[str, Any]]:
    """Cut the corpus into read parts, in corpus order.

    Returns:
        dicts with ``kind`` ``"range"`` (``path``, ``start``, ``end`` byte offsets at line starts,
        ``first_line`` 1-based), ``"file"`` (``path``: read whole by :func:`read_corpus`) or
        ``"records"`` (``blob``: pickled records, ``first_line``).

    Raises:
        CorpusError: a missing corpus or an unknown format (as :func:`read_corpus`).
    """
    read_corpus(corpus)  # a missing file or an unknown format fails here, as in one process
    if not isinstance(corpus, (str, Path)):
        parts, chunk, first = [], [], 1
        for i, rec in enumerate(corpus, start=1):
            chunk.append(rec)
            if len(chunk) >= PART_RECORDS:
                parts.append({"kind": "records", "blob": pickle.dumps(chunk), "first_line": first})
                chunk, first = [], i + 1
        if chunk or not parts:
            parts.append({"kind": "records", "blob": pickle.dumps(chunk), "first_line": first})
        return parts
    path = Path(corpus)
    if path.is_dir():
        path = find_beir_file(path, ("corpus.jsonl", "corpus.jsonl.gz"))  # type: ignore[assignment]
    name = path.name.lower()
    if not name.endswith((".jsonl", ".json", ".ndjson")):
        return [{"kind": "file", "path": str(path)}]
    size = path.stat().st_size
    n = max(1, min(max(n_workers, math.ceil(size / max(1, part_bytes))), max(1, size // 64)))
    cuts = [0]
    with open(path, "rb") as f:
        for j in range(1, n):
            f.seek(max(cuts[-1], size * j // n))
            if f.tell() > 0:
                f.seek(f.tell() - 1)
                f.readline()  # to the start of the next line
            pos = f.tell()
            if cuts[-1] < pos < size:
                cuts.append(pos)
    cuts.append(size)
    lines, parts = 1, []
    with open(path, "rb") as f:
        for a, b in zip(cuts, cuts[1:]):
            parts.append({"kind": "range", "path": str(path), "start": a, "end": b, "first_line": lines})
            left = b - a
            while left:
                chunk = f.read(min(left, 1 << 24))
                lines += chunk.count(b"\n")
                left -= len(chunk)
    return parts


def _range_records(path: str, start: int, end: int, first_line: int) -> Iterable[Document]:
    """The records of bytes [start, end) of a JSONL file (whole lines), checked as
    :func:`retriever.index.readers.iter_jsonl` and :func:`to_document` check them."""
    from .readers import _open_binary

    with _open_binary(Path(path)) as f:
        f.seek(start)
        data = f.read(end - start)
    for lineno, raw in enumerate(io.BytesIO(data), start=first_line):
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"not valid UTF-8 (byte {raw[e.start:e.start + 1]!r} at column {e.start + 1})",
                              path=path, line=lineno) from None
        if lineno == 1 and s.startswith("\ufeff"):
            s = s[1:]
        if not s.strip():
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise CorpusError(f"not valid JSON ({e.msg} at column {e.colno}): {s[:80]!r}", path=path,
                              line=lineno) from None
        yield to_document(obj, path, lineno)


def read_part(batch: pa.Table) -> pa.Table:
    """Ray Data ``map_batches`` function: the documents of each part in ``batch`` (a table of part
    descriptors, column ``desc`` pickled), as :data:`DOC_SCHEMA` rows; a bad record ends its part
    with one row whose ``error`` holds the pickled :class:`CorpusError`."""
    cols: dict[str, list[Any]] = {f.name: [] for f in DOC_SCHEMA}
    for part, blob in zip(batch.column("part").to_pylist(), batch.column("desc").to_pylist()):
        desc = pickle.loads(blob)
        if desc["kind"] == "range":
            docs: Iterable[Document] = _range_records(desc["path"], desc["start"], desc["end"], desc["first_line"])
        elif desc["kind"] == "file":
            docs = read_corpus(desc["path"])
        else:
            recs = pickle.loads(desc["blob"])
            docs = (to_document(r, None, i) for i, r in enumerate(recs, start=desc["first_line"]))
        row = 0
        try:
            for d in docs:
                for k, v in (("part", part), ("row", row), ("id", d.id), ("title", d.title), ("text", d.text),
                             ("meta", pickle.dumps(d.metadata) if d.metadata else b""), ("path", d.path),
                             ("line", d.line), ("error", b"")):
                    cols[k].append(v)
                row += 1
        except CorpusError as e:
            for k, v in (("part", part), ("row", row), ("id", ""), ("title", ""), ("text", ""), ("meta", b""),
                         ("path", None), ("line", 0), ("error", pickle.dumps(e))):
                cols[k].append(v)
    return pa.table(cols, schema=DOC_SCHEMA)


def _block_runs(table: pa.Table) -> list[tuple[int, int, int, int]]:
    """``(part, first row, n rows, offset in the block)`` of each run of consecutive rows of one part."""
    part = table.column("part").to_numpy()
    row = table.column("row").to_numpy()
    if not len(part):
        return []
    brk = np.flatnonzero((np.diff(part) != 0) | (np.diff(row) != 1)) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [len(part)]])
    return [(int(part[a]), int(row[a]), int(b - a), int(a)) for a, b in zip(starts, ends)]


# ----------------------------------------------------------------------------- shard documents

def shard_docs(blocks: Sequence[pa.Table], slices: Sequence[tuple[int, int, int]]) -> pa.Table:
    """One shard's rows from ``(block, offset, length)`` slices, in ordinal order."""
    return pa.concat_tables([blocks[b].slice(o, n) for b, o, n in slices])


def _texts(table: pa.Table) -> list[str]:
    """``"title text"`` (text alone without a title), as the one-process pipeline's Batch.texts."""
    return [f"{t} {x}" if t else x for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]


def _documents(table: pa.Table) -> list[Document]:
    meta = table.column("meta").to_pylist()
    return [Document(i, t, x, pickle.loads(m) if m else {}, p, ln) for i, t, x, m, p, ln in
            zip(table.column("id").to_pylist(), table.column("title").to_pylist(), table.column("text").to_pylist(),
                meta, table.column("path").to_pylist(), table.column("line").to_pylist())]


def batch_bounds(rows: int, batch_size: int) -> list[tuple[int, int]]:
    """The pipeline batches of a shard of ``rows`` documents: ``batch_size`` at a time from the
    shard's start (the one-process ``_batches``: a batch never crosses a shard boundary)."""
    return [(a, min(a + batch_size, rows)) for a in range(0, rows, batch_size)]


class ShardEncoder:
    """Ray Data encoder actor (``ActorPoolStrategy``): the dense and / or sparse vectors of whole
    shards, each pipeline batch one ``encode`` call as in one process.

    Args:
        config: the build configuration.
        device: encoder device (``cuda`` when the actor has a GPU).
        blocks: object references of the document blocks (nested in a list: not resolved).
        slices: per shard its ``(block, offset, length)`` slices.
        threads: torch threads (see ``RayExecutor.encoder_threads``).
    """

    def __init__(self, config: BuildConfig, device: str, blocks: list, slices: list, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)  # the one-process build's count: same rounding, same vectors
        t0 = time.perf_counter()
        self.config, self.blocks, self.slices = config, blocks, slices
        self.dense = self.sparse = None
        self.info: dict[str, Any] = {}
        if "dense" in config.legs:
            from .dense_build import model_fingerprint
            from .encoders.dense import DenseEncoder

            c = config.dense
            self.dense = DenseEncoder(c.model, max_length=c.max_length, batch_size=c.batch_size, device=device,
                                      normalize=c.normalize, precision=c.precision)
            self.info["dense"] = {**model_fingerprint(self.dense.path), "dim": self.dense.dim}
        if "sparse" in config.legs:
            from .encoders.sparse import SparseEncoder
            from .format import sha256_file

            sc = config.sparse
            self.sparse = SparseEncoder(sc.model, doc_max_length=sc.doc_max_length, query_max_length=sc.query_max_length,
                                        batch_size=sc.batch_size, device=device)
            path = self.sparse.path
            weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
            self.info["sparse"] = {"path": str(path), "name": path.name,
                                   "sha256": {p.name: sha256_file(p) for p in weights},
                                   "vocab_size": self.sparse.vocab_size, "pooling": "max", "activation": "log1p(relu)"}
        self.load_seconds = time.perf_counter() - t0

    def __call__(self, batch: pa.Table) -> pa.Table:
        import ray

        out: dict[str, list[Any]] = {"shard": [], "dense": [], "sparse": [], "stats": []}
        cache: dict[int, pa.Table] = {}
        for j in batch.column("shard").to_pylist():
            sl = self.slices[j]
            for b, _, _ in sl:
                if b not in cache:
                    cache[b] = ray.get(self.blocks[b])
            texts = _texts(shard_docs(cache, sl))  # type: ignore[arg-type]
            stats: dict[str, Any] = {"info": self.info, "load_seconds": self.load_seconds}
            dense = sparse = b""
            if self.dense is not None:
                t0, cut0 = time.perf_counter(), self.dense.n_truncated
                prefix = self.config.dense.document_prefix
                parts = [self.dense.encode([prefix + t for t in texts[a:e]]) for a, e in
                         batch_bounds(len(texts), self.config.batch_size)]
                vec = np.concatenate(parts) if parts else np.zeros((0, self.dense.dim), np.float32)
                dense = _npy({"v": np.ascontiguousarray(vec, dtype=np.float32)})
                stats["dense_seconds"] = time.perf_counter() - t0
                stats["dense_truncated"] = self.dense.n_truncated - cut0
            if self.sparse is not None:
                t0, cut0 = time.perf_counter(), self.sparse.n_truncated
                ptrs, terms, weights, base = [np.zeros(1, np.int64)], [], [], 0
                for a, e in batch_bounds(len(texts), self.config.batch_size):
                    ip, t, w = self.sparse.encode(texts[a:e])
                    ptrs.append(ip[1:].astype(np.int64) + base)
                    base += int(ip[-1])
                    terms.append(t)
                    weights.append(w)
                sparse = _npy({"indptr": np.concatenate(ptrs).astype(np.uint64),
                               "terms": np.concatenate(terms).astype(np.uint32) if terms else np.zeros(0, np.uint32),
                               "weights": (np.concatenate(weights).astype(np.float32) if weights
                                           else np.zeros(0, np.float32))})
                stats["sparse_seconds"] = time.perf_counter() - t0
                stats["sparse_truncated"] = self.sparse.n_truncated - cut0
            out["shard"].append(j)
            out["dense"].append(dense)
            out["sparse"].append(sparse)
            out["stats"].append(json.dumps(stats))
        return pa.table({"shard": pa.array(out["shard"], pa.int64()), "dense": pa.array(out["dense"], pa.large_binary()),
                         "sparse": pa.array(out["sparse"], pa.large_binary()), "stats": pa.array(out["stats"])})


def _npy(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _unnpy(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _encoded_rows(tables: Sequence[pa.Table]) -> dict[int, dict[str, Any]]:
    out = {}
    for t in tables:
        for j, d, s, st in zip(t.column("shard").to_pylist(), t.column("dense").to_pylist(),
                               t.column("sparse").to_pylist(), t.column("stats").to_pylist()):
            out[int(j)] = {"dense": d, "sparse": s, "stats": json.loads(st)}
    return out


# ------------------------------------------------------------------------------ phase 1 / 2

def analyse_shard(j: int, base: int, config: BuildConfig, blocks: list, slices: list, encoded: list,
                  faults: FaultHook) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    """Phase 1 of shard ``j`` (first ordinal ``base``): BM25 postings with the shard's own term
    ids, the shard's metadata types (first document of each field / type), ids and lines.

    Returns:
        ``(summary, postings)``: the summary for the driver (``terms``, ``ids``, ``lines``,
        ``paths``, ``fields``, ``firsts``, ``max_weight``, ``sum_dl``) and the local postings
        (``offsets``, ``doc_ids``, ``tfs``, ``doc_len``), which stay in the object store.
    """
    import ray

    table = shard_docs([ray.get(b) for b in blocks], slices)
    docs = _documents(table)
    summary: dict[str, Any] = {"ids": [d.id for d in docs], "lines": [d.line for d in docs],
                               "paths": [d.path for d in docs]}
    fields: list[str] = []
    firsts: dict[tuple[str, str], FirstSeen] = {}
    seen_fields: set[str] = set()
    for i, d in enumerate(docs):
        for name, v in d.metadata.items():
            if name not in seen_fields:
                seen_fields.add(name)
                fields.append(name)
            kind = None if v is None else value_kind(v)
            if kind is not None and (name, kind) not in firsts:
                firsts[(name, kind)] = FirstSeen(d.id, base + i, d.path, d.line)
    summary["fields"], summary["firsts"] = fields, firsts
    postings = None
    if "bm25" in config.legs:
        from .analyzer import Analyzer
        from .bm25_build import PostingsBuilder

        pb = PostingsBuilder(Analyzer(config.analyzer), background=False)
        texts = _texts(table)
        try:
            for a, e in batch_bounds(len(texts), config.batch_size):
                pb.add(texts[a:e])
                faults("encode_bm25")
            postings = pb.flush()
            summary["terms"] = list(pb.terms)
            summary["sum_dl"] = int(postings["doc_len"].sum(dtype=np.int64))
        finally:
            pb.close(raise_errors=False)
    if "sparse" in config.legs:
        w = _unnpy(ray.get(encoded[0]).column("sparse")[encoded[1]].as_py())["weights"]
        summary["max_weight"] = float(w.max()) if len(w) else 0.0
    return summary, postings


def remap_postings(p: Mapping[str, np.ndarray], mapping: np.ndarray, n_terms: int) -> dict[str, np.ndarray]:
    """A shard's postings with term ids ``mapping[local id]`` (global, distinct) in a CSR over
    ``n_terms`` terms; every list keeps its documents in order (doc ids ascending)."""
    offs = p["offsets"].astype(np.int64)
    lens = np.diff(offs)
    new_len = np.zeros(n_terms, np.int64)
    new_len[mapping] = lens
    offsets = np.zeros(n_terms + 1, np.uint64)
    np.cumsum(new_len, out=offsets[1:])
    perm = np.argsort(mapping, kind="stable")  # local terms in global id order
    plen = lens[perm]
    starts = np.repeat(offs[:-1][perm] - np.concatenate([[0], np.cumsum(plen)[:-1]]), plen)
    idx = starts + np.arange(int(plen.sum()), dtype=np.int64)
    return {"offsets": offsets, "doc_ids": p["doc_ids"][idx], "tfs": p["tfs"][idx], "doc_len": p["doc_len"]}


def write_shard(j: int, tmp: str, config: BuildConfig, blocks: list, slices: list, encoded: list | None,
                postings: list | None, mapping: np.ndarray | None, n_terms: int, schema: dict[str, str | None],
                scale: float, dense_info: dict[str, Any] | None, sparse_vocab: int, faults: FaultHook
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Phase 2 of shard ``j``: every file of ``shards/j`` in the build's temporary directory, as
    the one-process leg builders write them. Returns the shard's manifest entry, statistics and
    file records (for :meth:`IndexWriter.adopt_shard`). Running it again rewrites the same files."""
    import ray

    from .builders import ShardOutput

    table = shard_docs([ray.get(b) for b in blocks], slices)
    docs = _documents(table)
    shutil.rmtree(Path(tmp) / f"shards/{j:05d}", ignore_errors=True)  # a retried task starts clean
    writer = IndexWriter.for_shards(tmp, faults=faults)
    meta = MetadataColumns(schema=schema)
    handle = writer.begin_shard(ids=[d.id for d in docs], titles=[d.title for d in docs],
                                texts=[d.text for d in docs], metadata=meta.columns(docs), index=j)
    outputs: dict[str, ShardOutput] = {}
    enc = None
    if encoded is not None:
        enc_table = ray.get(encoded[0])
        enc = {"dense": enc_table.column("dense")[encoded[1]].as_py(),
               "sparse": enc_table.column("sparse")[encoded[1]].as_py()}
    for leg in config.legs:
        if leg == "bm25":
            arrays = remap_postings(ray.get(postings[0]), mapping, n_terms)  # type: ignore[index,arg-type]
            rel = writer.write_arrays(f"{handle.dir}/bm25.arrow", arrays)
            faults("shard_bm25")
            nnz = int(len(arrays["doc_ids"]))
            outputs["bm25"] = ShardOutput(files=[rel], stats={"n_docs": handle.rows, "sum_dl": int(
                arrays["doc_len"].sum(dtype=np.int64)), "n_terms": n_terms, "nnz": nnz},
                entry={"n_terms": n_terms, "nnz": nnz})
        elif leg == "dense":
            from .dense_build import DenseBuilder

            vec = _unnpy(enc["dense"])["v"]  # type: ignore[index]
            b = DenseBuilder(config.dense, faults, vectors=vec, model_info=dense_info)
            texts = _texts(table)
            for a, e in batch_bounds(len(docs), config.batch_size):
                b.add(Batch(docs[a:e], texts[a:e]))
            outputs["dense"] = b.finish_shard(writer, handle)
        elif leg == "sparse":
            outputs["sparse"] = _write_sparse(writer, handle, config, _unnpy(enc["sparse"]), scale,  # type: ignore[index]
                                            sparse_vocab)
    entry = writer.end_shard(handle, outputs)
    return entry, writer.shard_stats[handle.dir], writer.files


def _write_sparse(writer: IndexWriter, shard: ShardHandle, config: BuildConfig, fwd: dict[str, np.ndarray],
                  scale: float, vocab_size: int) -> ShardOutput:
    """``sparse.arrow`` and ``sparse_index.arrow`` of one shard with the corpus-wide ``scale``: what
    :class:`retriever.index.sparse_build.SparseBuilder` writes (its ``finish`` step included)."""
    from .sparse_index import build_sparse_index

    sc = config.sparse
    files = [writer.write_arrays(f"{shard.dir}/sparse.arrow", fwd)]
    arrays = build_sparse_index(fwd["indptr"], fwd["terms"], fwd["weights"], n_terms=vocab_size, scale=scale,
                                n_postings=sc.n_postings, block_size=sc.block_size, summary_energy=sc.summary_energy)
    files.append(writer.write_arrays(f"{shard.dir}/sparse_index.arrow", arrays))
    nnz = int(len(fwd["terms"]))
    w = fwd["weights"]
    stats = {"n_docs": int(len(fwd["indptr"]) - 1), "nnz": nnz, "max_weight": float(w.max()) if len(w) else 0.0,
             "vocab_size": vocab_size, "scale": scale}
    return ShardOutput(files=files, stats=stats, entry={"sparse_nnz": nnz})


# ----------------------------------------------------------------------------------- the driver

def _retriever_error(e: BaseException) -> RetrieverError | None:
    """The project error a Ray exception carries (``cause`` / ``__cause__`` chain), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, RetrieverError):
            return e
        nxt = getattr(e, "cause", None)
        e = nxt if isinstance(nxt, BaseException) else (e.__cause__ or e.__context__)  # type: ignore[assignment]
    return None


def _first_metadata_conflict(summaries: Sequence[Mapping[str, Any]]) -> CorpusError | None:
    """The mixed-type metadata field that a one-process build reports: the earliest document whose
    value's type differs from the field's first type (message as ``MetadataColumns``)."""
    first: dict[str, dict[str, FirstSeen]] = {}
    for s in summaries:
        for (name, kind), fs in s["firsts"].items():
            first.setdefault(name, {}).setdefault(kind, fs)
    worst: tuple[int, str, str, FirstSeen, FirstSeen] | None = None
    for name, kinds in first.items():
        if len(kinds) < 2:
            continue
        order = sorted(kinds.items(), key=lambda kv: kv[1].position)
        (have, fh), (kind, fk) = order[0], order[1]
        if worst is None or fk.position < worst[0]:
            worst = (fk.position, name, have, fh, fk)
    if worst is None:
        return None
    _, name, have, fh, fk = worst
    kind = next(k for k, f in first[name].items() if f is fk)
    return CorpusError(f"metadata field {name!r} has mixed types in one build: {have} (first in {fh.describe()}) and "
                       f"{kind} (first in {fk.describe()})", path=fk.path, line=fk.line, field=name)


def _schemas(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, str | None]]:
    """Per shard the metadata types known before it (fields in first-seen order; a field whose
    first value comes later is still ``None``), as the one-process ``MetadataColumns`` holds them."""
    out, fields, kind_at = [], [], {}
    for s in summaries:
        for (name, kind), fs in s["firsts"].items():
            if name not in kind_at or fs.position < kind_at[name][1]:
                kind_at[name] = (kind, fs.position)
    start = 0
    for s in summaries:
        out.append({f: (kind_at[f][0] if f in kind_at and kind_at[f][1] < start else None) for f in fields})
        for f in s["fields"]:
            if f not in fields:
                fields.append(f)
        start += len(s["ids"])
    return out


def _duplicate(summaries: Sequence[Mapping[str, Any]]) -> CorpusError | None:
    """The first document (corpus order) whose id an earlier one has, as a one-process build names it."""
    ids = np.array([i for s in summaries for i in s["ids"]], dtype=object)
    if not len(ids):
        return None
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(ids):
        return None
    dup = np.ones(len(ids), bool)
    dup[first] = False
    p = int(np.flatnonzero(dup)[0])
    for s in summaries:
        if p < len(s["ids"]):
            return CorpusError(f"duplicate document id {s['ids'][p]!r}", path=s["paths"][p], line=s["lines"][p],
                               field="_id")
        p -= len(s["ids"])
    return None


def build_distributed(corpus: Any, out: Path, config: BuildConfig, executor: RayExecutor, *, overwrite: bool,
                      faults: FaultHook | None = None, t0: float | None = None,
                      sparse_scale: float | None = None) -> dict[str, Any]:
    """The body of ``build_index(..., executor=RayExecutor(...))`` (stages in the module docstring).

    Returns:
        the manifest of generation 1.

    Raises:
        CorpusError: a bad record, a duplicate id, mixed metadata types or an empty corpus (the
            first one in corpus order, as one process reports it).
        ConfigError: an option this build does not support (precomputed vectors, a fitted
            Matryoshka rotation) or a bad configuration.
        DistributedError: a worker failed beyond its retries, or the cluster is unreachable.
        IndexExistsError: ``out`` exists and ``overwrite`` is False.
    On any error nothing is left at ``out``.
    """
    t0 = time.perf_counter() if t0 is None else t0
    faults = faults or no_faults
    if "dense" in config.legs and config.dense.matryoshka_dims and not config.dense.mrl_trained:
        raise ConfigError("a Ray build cannot fit a Matryoshka rotation yet (matryoshka_dims without "
                          "mrl_trained); build in one process, or pass mrl_trained=True")
    check_target(out, overwrite)
    parts = plan_parts(corpus, executor.num_workers)
    ray = executor.connect()
    import ray.data as rd

    quiet = logging.getLogger("ray.data")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # Ray Data's per-stage INFO lines and progress-bar notice
    saved = rd.DataContext.get_current()
    ctx = saved.copy()  # this build's settings, the caller's context restored afterwards
    ctx.execution_options.preserve_order = True  # not relied on: ordinals come from the (part, row) tags
    ctx.enable_progress_bars = False
    rd.DataContext._set_current(ctx)
    pending: list = []
    try:
        with IndexWriter(out, overwrite=overwrite, faults=faults) as writer:
            return _build(ray, rd, parts, writer, config, executor, faults, pending, t0, corpus, sparse_scale)
    except BaseException as e:
        # Nothing may still write into the (removed) temporary directory: the shard tasks still
        # running are waited for, not cancelled. (``ray.cancel(force=True)`` of a task whose reply
        # is already on its way makes Ray 2.60's driver fail an internal check and exit the whole
        # process: "Tried to complete task that was not pending".) A shard task is bounded work.
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=120)
            shutil.rmtree(writer.tmp, ignore_errors=True) if "writer" in locals() else None
        if isinstance(e, RetrieverError):
            raise
        found = _retriever_error(e)
        if found is not None:
            raise found from None
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise DistributedError(f"Ray build of {out} failed ({type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}) after "
                               f"{executor.max_restarts} retries; nothing was written") from None
    finally:
        rd.DataContext._set_current(saved)
        quiet.setLevel(level)


def _get(ray: Any, refs: list, what: Sequence[str]) -> list:
    """``ray.get`` of each ref; a project error is raised as itself, a dead worker names ``what[i]``."""
    out = []
    for ref, w in zip(refs, what):
        try:
            out.append(ray.get(ref))
        except Exception as e:  # noqa: BLE001 - Ray's task / actor errors
            found = _retriever_error(e)
            if found is not None:
                raise found from None
            raise DistributedError(f"Ray build: {w} failed ({type(e).__name__}) after retries; nothing was "
                                   f"written") from None
    return out


def _build(ray: Any, rd: Any, parts: list, writer: IndexWriter, config: BuildConfig, executor: RayExecutor,
           faults: FaultHook, pending: list, t0: float, corpus: Any, sparse_scale: float | None) -> dict[str, Any]:
    retries = executor.max_restarts
    # --- read: one Ray Data task per part; blocks tagged (part, row)
    items = [{"part": i, "desc": pickle.dumps(p)} for i, p in enumerate(parts)]
    with warnings.catch_warnings():  # Ray 2.60 deprecates passing retry limits to map_batches; no successor yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args")
        docs_ds = rd.from_items(items, override_num_blocks=len(items)).map_batches(
            read_part, batch_size=1, batch_format="pyarrow", num_cpus=executor.num_cpus_per_worker or None,
            ray_remote_args_fn=lambda: {"max_retries": retries})
    try:
        docs_ds = docs_ds.materialize()
        block_refs = list(docs_ds.to_arrow_refs())
    except Exception as e:  # noqa: BLE001
        found = _retriever_error(e)
        if found is not None:
            raise found from None
        raise
    runs_of = ray.remote(_block_runs).options(max_retries=retries)
    runs = _get(ray, [runs_of.remote(r) for r in block_refs], [f"counting block {i}" for i in range(len(block_refs))])
    errors_of = ray.remote(_block_errors).options(max_retries=retries)
    errs = [e for es in _get(ray, [errors_of.remote(r) for r in block_refs], ["reading"] * len(block_refs)) for e in es]
    if errs:
        raise min(errs, key=lambda x: x[0])[1]
    # --- global ordinals: parts in order, rows in order
    order = sorted((part, row, n, b, off) for b, rs in enumerate(runs) for part, row, n, off in rs)
    pieces = [(b, off, n) for _, _, n, b, off in order]
    n_docs = sum(n for _, _, n in pieces)
    if n_docs == 0:
        raise CorpusError("corpus is empty (no documents)", path=corpus if isinstance(corpus, (str, Path)) else None)
    bounds = [(a, min(a + config.shard_size, n_docs)) for a in range(0, n_docs, config.shard_size)]
    slices = _cut(pieces, bounds)

    def local(j: int) -> tuple[list, list]:
        used = sorted({b for b, _, _ in slices[j]})
        at = {b: i for i, b in enumerate(used)}
        return [block_refs[b] for b in used], [(at[b], o, n) for b, o, n in slices[j]]

    # --- encode: Ray Data actor pool, one shard per call
    encoded: dict[int, list] = {}
    enc_stats: dict[int, dict[str, Any]] = {}
    if "dense" in config.legs or "sparse" in config.legs:
        gpu = executor.num_gpus_per_worker > 0
        device = "cuda" if gpu and config.device == "cpu" else config.device
        shards_ds = rd.from_items([{"shard": j} for j in range(len(bounds))], override_num_blocks=len(bounds))
        threads = executor.encoder_threads
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*ray_remote_args")
            enc_ds = shards_ds.map_batches(
                ShardEncoder, batch_size=1, batch_format="pyarrow",
                compute=rd.ActorPoolStrategy(size=min(executor.num_workers, len(bounds))),
                fn_constructor_kwargs={"config": config, "device": device, "blocks": block_refs, "slices": slices,
                                       "threads": threads},
                num_gpus=executor.num_gpus_per_worker or None, num_cpus=executor.num_cpus_per_worker or None,
                ray_remote_args_fn=lambda: {"max_restarts": retries, "max_task_retries": retries})
        try:
            enc_ds = enc_ds.materialize()
            enc_refs = list(enc_ds.to_arrow_refs())
        except Exception as e:  # noqa: BLE001
            found = _retriever_error(e)
            if found is not None:
                raise found from None
            raise DistributedError(f"Ray build: the encoder actors failed ({type(e).__name__}) after {retries} "
                                   f"restarts; nothing was written") from None
        shard_col = ray.remote(_shard_rows).options(max_retries=retries)
        for ref, rows in zip(enc_refs, _get(ray, [shard_col.remote(r) for r in enc_refs], ["encoding"] * len(enc_refs))):
            for row, (j, st) in enumerate(rows):
                encoded[j] = [ref, row]
                enc_stats[j] = st
        missing = [j for j in range(len(bounds)) if j not in encoded]
        if missing:
            raise DistributedError(f"Ray build: shards {missing} were not encoded; nothing was written")
    # --- phase 1
    analyse = ray.remote(analyse_shard).options(num_returns=2, max_retries=retries,
                                                num_cpus=executor.num_cpus_per_worker)
    summaries_refs, postings_refs = [], []
    for j, (a, _) in enumerate(bounds):
        blocks, sl = local(j)
        s_ref, p_ref = analyse.remote(j, a, config, blocks, sl, encoded.get(j), faults)
        summaries_refs.append(s_ref)
        postings_refs.append(p_ref)
    pending.extend(summaries_refs)
    summaries = _get(ray, summaries_refs, [f"analysing shard {j}" for j in range(len(bounds))])
    for err in (_duplicate(summaries), _first_metadata_conflict(summaries)):
        if err is not None:
            raise err
    schemas = _schemas(summaries)
    terms: list[str] = []
    vocab: dict[str, int] = {}
    maps, n_terms_at = [], []
    for s in summaries:
        if "terms" in s:
            maps.append(np.fromiter((vocab.setdefault(t, len(vocab)) for t in s["terms"]), np.int64, len(s["terms"])))
            n_terms_at.append(len(vocab))
        else:
            maps.append(None)
            n_terms_at.append(0)
    terms = list(vocab)
    info = next(iter(enc_stats.values()))["info"] if enc_stats else {}
    max_weight = max((s.get("max_weight", 0.0) for s in summaries), default=0.0)
    from .sparse_index import impact_scale

    scale = impact_scale(max_weight) if sparse_scale is None else sparse_scale
    sparse_vocab = int(info.get("sparse", {}).get("vocab_size", 0))
    # --- phase 2
    write = ray.remote(write_shard).options(max_retries=retries, num_cpus=executor.num_cpus_per_worker)
    written_refs = []
    for j in range(len(bounds)):
        blocks, sl = local(j)
        written_refs.append(write.remote(j, str(writer.tmp), config, blocks, sl, encoded.get(j),
                                         [postings_refs[j]] if "bm25" in config.legs else None, maps[j],
                                         n_terms_at[j], schemas[j], scale, info.get("dense"), sparse_vocab, faults))
    pending.extend(written_refs)
    written = _get(ray, written_refs, [f"writing shard {j}" for j in range(len(bounds))])
    pending.clear()
    for entry, stats, files in written:
        writer.adopt_shard(entry, stats, files)
    # --- index-level files and the manifest
    outputs: dict[str, IndexOutput] = {}
    load_s = max((st.get("load_seconds", 0.0) for st in enc_stats.values()), default=0.0)
    for leg in config.legs:
        if leg == "bm25":
            writer.write_vocab(terms)
            faults("vocab")
            outputs["bm25"] = IndexOutput(stats={"n_terms": len(terms), "sum_dl": sum(s["sum_dl"] for s in summaries)})
        elif leg == "dense":
            dtypes = [writer.shard_stats[e["dir"]]["dense"]["dtype"] for e in writer.shards]
            dtype = "float32" if "float32" in dtypes else config.dense.dtype
            outputs["dense"] = IndexOutput(
                stats={"dense_dim": int(info["dense"]["dim"]), "dense_dtype": dtype}, config={"dtype": dtype},
                build={"dense_truncated_docs": sum(st.get("dense_truncated", 0) for st in enc_stats.values()),
                       "model_load_seconds": load_s,
                       "encode_seconds": sum(st.get("dense_seconds", 0.0) for st in enc_stats.values())},
                model=info["dense"])
            if config.dense.matryoshka_dims:  # MRL-trained: prefixes as they are, no rotation file
                from .matryoshka import MatryoshkaBuilder

                mat = MatryoshkaBuilder(int(info["dense"]["dim"]), config.dense.matryoshka_dims, mrl_trained=True,
                                        dtype=dtype, rotation_sample=config.dense.rotation_sample)
                outputs["dense"].extra["matryoshka"] = mat.finish(writer)
        elif leg == "sparse":
            outputs["sparse"] = IndexOutput(
                stats={"sparse_scale": scale, "sparse_vocab_size": sparse_vocab,
                       "sparse_nnz": sum(writer.shard_stats[e["dir"]]["sparse"]["nnz"] for e in writer.shards)},
                build={"sparse_precomputed": False,
                       "sparse_truncated_docs": sum(st.get("sparse_truncated", 0) for st in enc_stats.values()),
                       "sparse_doc_max_length": config.sparse.doc_max_length, "model_load_seconds": load_s,
                       "encode_seconds": sum(st.get("sparse_seconds", 0.0) for st in enc_stats.values())},
                model=info["sparse"])
    cfg, stats, build, extra = manifest_parts(config, n_docs, outputs, time.perf_counter() - t0)
    build["executor"] = {"kind": "ray", "workers": executor.num_workers, "gpus_per_worker": executor.num_gpus_per_worker,
                         "read_parts": len(parts)}
    return writer.commit(build_config=cfg, stats=stats, build=build, extra=extra)


def _cut(pieces: Sequence[tuple[int, int, int]], bounds: Sequence[tuple[int, int]]) -> list[list[tuple[int, int, int]]]:
    """Per shard ``[a, e)`` of ordinals its ``(block, offset, length)`` slices of ``pieces`` (runs
    of consecutive ordinals, in ordinal order)."""
    out: list[list[tuple[int, int, int]]] = [[] for _ in bounds]
    pos = 0
    j = 0
    for b, off, n in pieces:
        lo, hi = pos, pos + n
        while lo < hi:
            a, e = bounds[j]
            take = min(hi, e) - lo
            out[j].append((b, off + (lo - pos), take))
            lo += take
            if lo >= e:
                j += 1
        pos = hi
    return out


def _block_errors(table: pa.Table) -> list[tuple[tuple[int, int], CorpusError]]:
    """The error rows of a block: ``((part, row), error)``."""
    err = table.column("error").to_pylist()
    part = table.column("part").to_pylist()
    row = table.column("row").to_pylist()
    return [((p, r), pickle.loads(e)) for p, r, e in zip(part, row, err) if e]


def _shard_rows(table: pa.Table) -> list[tuple[int, dict[str, Any]]]:
    """``(shard, encoder statistics)`` of each row of an encoded block."""
    return [(int(j), json.loads(s)) for j, s in zip(table.column("shard").to_pylist(), table.column("stats").to_pylist())]
