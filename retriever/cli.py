"""Command line: ``retriever index build|info|verify|upgrade``, ``retriever search``, ``retriever eval``,
``retriever bench``, ``retriever fusion fit|clear``.

A thin layer over the library: it parses arguments, calls it and prints. Exit codes: 0 success,
1 bad input or index (one-line error on stderr), 2 usage error (argparse).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from retriever.index.config import BuildConfig, DenseConfig, SparseConfig
from retriever.index.errors import ConfigError, CorpusError, QueryError, RetrieverError


def _legs(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def _leg_params(s: str) -> dict[str, Any]:
    try:
        v = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--leg-params: not valid JSON ({e})") from None
    if not isinstance(v, dict) or not all(isinstance(x, dict) for x in v.values()):
        raise argparse.ArgumentTypeError(f"--leg-params: expected {{leg: {{option: value}}}}, got {s!r}")
    return v


def _filter(s: str) -> dict[str, Any]:
    try:
        v = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--filter: not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"--filter: expected a JSON object such as '{{\"year\": {{\"$gte\": 2020}}}}', "
                                         f"got {s!r}")
    return v


class _HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default: "(default: X)" is appended to help text that does
    not state its default already, for options whose default is a value (not None / False / "")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text or d is None or d is False or d == "" or d is argparse.SUPPRESS or not action.option_strings:
            return text
        shown = ",".join(map(str, d)) if isinstance(d, (tuple, list)) else d
        return f"{text} (default: {shown})"


def _search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fusion", default=None,
                   help="rrf | dbsf | tmm | linear[:minmax|zscore|dbsf|tmm|theoretical|none] "
                        "(default: the index's fitted setting, else the library default)")
    p.add_argument("--full-score", action="store_true", help="full-score fusion: every leg scores every candidate")
    p.add_argument("--rrf-k", type=float, default=None, help="RRF constant k (selects RRF; default 60 with --fusion rrf, 40 for the default fusion)")
    p.add_argument("--weights", default=None, help="per-leg fusion weights, e.g. bm25=1,dense=1.5")
    p.add_argument("--depth", type=_positive_int, default=None, help="candidates per leg before fusion (default 100)")
    p.add_argument("--threads", type=_positive_int, default=None, help="kernel threads (default: all cores)")
    p.add_argument("--leg-params", type=_leg_params, default=None,
                   help='per-leg search options as JSON, e.g. \'{"dense": {"dim": 64, "shortlist": 200}}\'')
    p.add_argument("--filter", type=_filter, default=None,
                   help='metadata filter as JSON (docs/FILTERS.md), e.g. \'{"year": {"$gte": 2020}, "lang": "en"}\'')


def build_parser() -> argparse.ArgumentParser:
    """The ``retriever`` argument parser (sub-commands index build / info / verify / upgrade, search, eval, bench)."""
    ap = argparse.ArgumentParser(prog="retriever", description="Hybrid BM25 + dense + learned-sparse retrieval.",
                                 formatter_class=_HelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = ap.add_subparsers(dest="command", required=True)

    idx = sub.add_parser("index", help="build or inspect an index", formatter_class=_HelpFormatter).add_subparsers(dest="index_command", required=True)
    b = idx.add_parser("build", help="build an index from a corpus", formatter_class=_HelpFormatter)
    b.add_argument("--corpus", required=True, help="BEIR folder, .jsonl[.gz], .parquet, .csv or .tsv")
    b.add_argument("--out", required=True, help="index directory to create")
    b.add_argument("--legs", type=_legs, default=("bm25", "dense"), help="comma list of bm25,dense,sparse (default bm25,dense)")
    b.add_argument("--dense-model", default=None, help="local Hugging Face checkpoint (default: bundled all-MiniLM-L6-v2)")
    b.add_argument("--dense-dtype", choices=("float16", "float32"), default="float16",
                   help="storage type of the dense vectors")
    b.add_argument("--dense-precision", choices=("float32", "bfloat16"), default="float32",
                   help="arithmetic of the document encoder's forward pass (bfloat16: ~2.4x faster on "
                        "CPUs with native bf16, vectors at cosine >= 0.99997 to float32)")
    b.add_argument("--faiss-factory", default="Flat", help="FAISS index_factory string (default Flat)")
    b.add_argument("--sparse-model", default=None, help="local SPLADE checkpoint (default: bundled 2-layer SPLADE)")
    b.add_argument("--sparse-doc-max-length", type=_positive_int, default=256, help="SPLADE tokens per document")
    b.add_argument("--sparse-n-postings", type=int, default=1000, help="approximate sparse index: postings kept per term (0 = all)")
    b.add_argument("--sparse-block-size", type=_positive_int, default=10, help="approximate sparse index: mean docs per block")
    b.add_argument("--matryoshka-dims", default="", help="prefix dims for funnel search, e.g. 64,128,256,384 "
                   "(fits a PCA rotation unless --mrl-trained)")
    b.add_argument("--mrl-trained", action="store_true", help="the dense model is Matryoshka-trained: no rotation")
    b.add_argument("--shard-size", type=_positive_int, default=100_000, help="documents per shard")
    b.add_argument("--batch-size", type=_positive_int, default=1024, help="documents per pipeline batch")
    b.add_argument("--device", default="cpu", help="cpu or cuda (encoders)")
    b.add_argument("--overwrite", action="store_true", help="replace an existing index at --out (atomic swap)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="build on a Ray cluster (ADDRESS, e.g. auto or ray://host:10001; none: RAY_ADDRESS or a cluster started on this machine, else a new local one); "
                        "see docs/DISTRIBUTED.md")
    b.add_argument("--ray-workers", type=_positive_int, default=2, help="Ray encoder actors / shard builders (default 2)")
    b.add_argument("--ray-gpus", type=float, default=0.0, help="GPUs per Ray encoder actor (default 0)")

    i = idx.add_parser("info", help="print an index summary", formatter_class=_HelpFormatter)
    i.add_argument("dir", help="index directory")
    v = idx.add_parser("verify", help="check every file's SHA-256 against the manifest, and that the directory holds no unlisted files, symlinks or special files", formatter_class=_HelpFormatter)
    v.add_argument("dir", help="index directory")
    u = idx.add_parser("upgrade", help="convert an index of an older format version to the current one (atomically)",
                       formatter_class=_HelpFormatter)
    u.add_argument("dir", help="index directory")

    for name, what in (("add", "add documents (new ids only) to an index, one commit"),
                       ("upsert", "add documents, replacing those with the same _id, one commit")):
        a = idx.add_parser(name, help=what, formatter_class=_HelpFormatter)
        a.add_argument("dir", help="index directory")
        a.add_argument("--corpus", required=True, help="BEIR folder, .jsonl[.gz], .parquet, .csv or .tsv")
        a.add_argument("--dense-vectors", default=None,
                       help=".npy file of float (n_docs, dim) vectors in corpus order (indexes built with precomputed vectors)")
        a.add_argument("--device", default="cpu", help="cpu or cuda (encoders)")
    d = idx.add_parser("delete", help="delete documents by id, one commit", formatter_class=_HelpFormatter)
    d.add_argument("dir", help="index directory")
    d.add_argument("ids", nargs="*", help="document ids")
    d.add_argument("--ids", dest="ids_file", default=None, help="file with one document id per line")
    c = idx.add_parser("compact", help="merge small / delete-heavy segments and drop their tombstones, one commit",
                       formatter_class=_HelpFormatter)
    c.add_argument("dir", help="index directory")
    c.add_argument("--full", action="store_true", help="rewrite every segment")
    c.add_argument("--small-rows", type=int, default=None, help="segments below this many rows are merged (default 10000)")
    c.add_argument("--max-deleted-fraction", type=float, default=None,
                   help="segments with at least this fraction deleted are rewritten (default 0.25)")

    s = sub.add_parser("search", help="search an index", formatter_class=_HelpFormatter)
    s.add_argument("dir", help="index directory")
    s.add_argument("query", help="query text")
    s.add_argument("-k", type=_positive_int, default=10, help="hits to print")
    s.add_argument("--mode", default="hybrid", choices=("hybrid", "bm25", "dense", "sparse"), help="leg or fusion")
    s.add_argument("--json", action="store_true", help="print JSON")
    _search_options(s)

    e = sub.add_parser("eval", help="evaluate against qrels (nDCG@10, Recall@100, MRR@10)", formatter_class=_HelpFormatter)
    e.add_argument("dir", help="index directory")
    e.add_argument("--queries", required=True, help="queries.jsonl (BEIR) or qid<TAB>text .tsv")
    e.add_argument("--qrels", required=True, help="qrels .tsv (BEIR) or TREC qrels")
    e.add_argument("--mode", action="append", choices=("hybrid", "bm25", "dense", "sparse"),
                   help="repeatable; default: every leg of the index and hybrid")
    e.add_argument("-k", type=_positive_int, default=100, help="hits per query in the run (default 100)")
    e.add_argument("--run-out", default=None, help="write the TREC run here (FILE.<mode> when several modes)")
    e.add_argument("--json", action="store_true", help="one JSON object per mode")
    _search_options(e)

    bn = sub.add_parser("bench", help="QPS, latency p50/p95/p99, recall@k vs exact search, peak RSS, index size", formatter_class=_HelpFormatter)
    bn.add_argument("dir", help="index directory")
    bn.add_argument("--queries", required=True, help="queries.jsonl (BEIR) or qid<TAB>text .tsv")
    bn.add_argument("--mode", action="append", choices=("hybrid", "bm25", "dense", "sparse"),
                    help="repeatable; default: every leg of the index and hybrid")
    bn.add_argument("-k", type=_positive_int, default=10, help="hits per query (default 10)")
    bn.add_argument("--batch-size", type=_positive_int, default=1,
                    help="queries per search call; one latency sample per batch (default 1 = per query)")
    bn.add_argument("--query-vectors", default=None,
                    help=".npy float32 (nq, dim) dense query vectors in query-file order (excludes encoding)")
    bn.add_argument("--max-queries", type=_positive_int, default=None, help="use the first N queries")
    bn.add_argument("--no-recall", action="store_true", help="skip the exact-search pass")
    bn.add_argument("--json", action="store_true", help="print the full report as JSON")
    _search_options(bn)

    fz = sub.add_parser("fusion", help="fit a fusion setting from labelled queries and store it in the index",
                        formatter_class=_HelpFormatter).add_subparsers(dest="fusion_command", required=True)
    ft = fz.add_parser("fit", help="k-fold cross-validated search over fusion settings; stores the best "
                       "as a new generation", formatter_class=_HelpFormatter)
    ft.add_argument("dir", help="index directory")
    ft.add_argument("--queries", required=True, help="labelled queries (never the split you report on)")
    ft.add_argument("--qrels", required=True, help="their qrels; every judged query must be in --queries")
    ft.add_argument("--metric", default="ndcg@10", help="ndcg@N | recall@N | mrr@N")
    ft.add_argument("--folds", type=_positive_int, default=5, help="cross-validation folds")
    ft.add_argument("-k", type=_positive_int, default=100, help="search k the setting is fitted for")
    ft.add_argument("--split", default=None, help="name of the labelled split, recorded with the setting "
                    "(default: the queries file's name)")
    ft.add_argument("--rule", default="smooth", choices=("smooth", "lcb", "argmax", "combined", "combined_depths",
                                                          "combined_depths_mix"),
                    help="selection rule (docs/FUSION.md): the best weight neighbourhood, the one-SE rule "
                    "over equal weights, the plain arg-max, or 'combined' (a linear model over per-leg features "
                    "fitted by coordinate ascent; nDCG only), or 'combined_depths' (the same with each leg's candidate depth "
                    "fitted under full scoring), or 'combined_depths_mix' (that, fitted on the mean of nDCG@10 and nDCG@20)")
    ft.add_argument("--dry-run", action="store_true", help="report only; store nothing")
    ft.add_argument("--threads", type=_positive_int, default=None, help="kernel threads (default: all cores)")
    ft.add_argument("--json", action="store_true", help="print the report as JSON")
    fc = fz.add_parser("clear", help="remove the stored fusion setting (new generation)", formatter_class=_HelpFormatter)
    fc.add_argument("dir", help="index directory")
    return ap


def _fusion(args: argparse.Namespace):
    """The fusion of ``--fusion`` / ``--weights`` / ``--rrf-k`` / ``--full-score``
    (:func:`retriever.fusion.parse_fusion`); None when none is given (the index's stored setting
    or the library default applies)."""
    from .fusion import parse_fusion

    full = bool(getattr(args, "full_score", False))
    if args.fusion is None and args.weights is None and args.rrf_k is None and not full:
        return None
    f = parse_fusion(args.fusion, weights=args.weights, rrf_k=args.rrf_k)
    return dataclasses.replace(f, full_score=True) if full else f


def cmd_build(args: argparse.Namespace) -> int:
    """``retriever index build``: :func:`retriever.index.pipeline.build_index` over a corpus file or BEIR folder; returns the exit status."""
    from retriever.index.matryoshka import check_dims
    from retriever.index.pipeline import build_index

    cfg = BuildConfig(legs=args.legs, shard_size=args.shard_size, batch_size=args.batch_size, device=args.device,
                      dense=DenseConfig(model=args.dense_model, dtype=args.dense_dtype, precision=args.dense_precision, faiss_factory=args.faiss_factory,
                                        matryoshka_dims=check_dims(args.matryoshka_dims),
                                        mrl_trained=args.mrl_trained),
                      sparse=SparseConfig(model=args.sparse_model, doc_max_length=args.sparse_doc_max_length,
                                          n_postings=args.sparse_n_postings, block_size=args.sparse_block_size))
    executor = None
    if args.ray is not None:
        from retriever.index.distributed import RayExecutor

        executor = RayExecutor(address=args.ray or None, num_workers=args.ray_workers, num_gpus_per_worker=args.ray_gpus)
    m = build_index(args.corpus, args.out, cfg, overwrite=args.overwrite, show_progress=not args.no_progress,
                    executor=executor)
    st = m["build"]
    print(f"built {args.out}: {m['stats']['n_docs']} documents in {len(m['shards'])} shard(s), legs {','.join(cfg.legs)}, "
          f"{st['build_seconds']:.1f} s")
    if st.get("dense_truncated_docs"):
        print(f"note: {st['dense_truncated_docs']} documents were longer than the dense model's "
              f"max_length ({cfg.dense.max_length} tokens) and were truncated for the dense leg")
    if st.get("sparse_truncated_docs"):
        print(f"note: {st['sparse_truncated_docs']} documents were longer than the sparse model's "
              f"doc_max_length ({cfg.sparse.doc_max_length} tokens) and were truncated for the sparse leg")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``retriever index info``: print the index's manifest summary as JSON; returns the exit status."""
    from .shards import IndexReader

    print(json.dumps(IndexReader(args.dir).info(), indent=2))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``retriever index verify``: open the index checking every file's checksum; returns the exit status."""
    from .shards import IndexReader

    from retriever.index.audit import audit_directory

    r = IndexReader(args.dir, verify=True)
    problems = audit_directory(args.dir)
    if problems:  # files the index does not use, symlinks, special files: each an error line
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 1
    print(f"ok: {len(r.manifest['files'])} files verified (SHA-256), no unlisted files or symlinks")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """``retriever index upgrade``: convert a format-1 index to the current format in place, atomically (:func:`retriever.index.upgrade.upgrade_index`); returns the exit status."""
    from retriever.index.upgrade import upgrade_index

    rep = upgrade_index(args.dir)
    print(f"upgraded {rep['path']}: format {rep['from_version']} -> {rep['to_version']}, {rep['n_docs']} documents "
          f"in {rep['n_shards']} shard(s)")
    if rep["json_fallbacks"]:
        print(f"note: metadata fields {rep['json_fallbacks']} hold values of more than one type; stored as JSON columns")
    return 0


def _load_npy(path: str, flag: str, error: type[Exception]) -> Any:
    """The array of the ``.npy`` file ``path`` given with ``flag`` (no pickles).

    Raises:
        ``error``: the file is missing, not an ``.npy`` array file, or an ``.npz`` archive (names
            the flag and the file).
    """
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise error(f"{flag}: file not found: {path!r}") from None
    except (OSError, ValueError, EOFError) as e:
        raise error(f"{flag}: {path!r} is not a .npy array file ({e})") from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise error(f"{flag}: {path!r} holds an .npz archive, expected one .npy array")
    return arr


def cmd_add(args: argparse.Namespace) -> int:
    """``retriever index add`` / ``upsert``: :class:`retriever.index.updates.IndexUpdater` add or
    upsert of a corpus, then one commit; returns the exit status."""
    from retriever.index.updates import IndexUpdater

    vectors = None if args.dense_vectors is None else _load_npy(args.dense_vectors, "--dense-vectors", ConfigError)
    t0 = time.perf_counter()
    with IndexUpdater.open(args.dir, device=args.device) as u:
        n = (u.upsert if args.index_command == "upsert" else u.add)(args.corpus, dense_vectors=vectors)
        gen = u.commit()
        live = sum(s.rows - s.n_deleted() for s in u.segments)
    verb = "upserted" if args.index_command == "upsert" else "added"
    print(f"{verb} {n} documents to {args.dir}: generation {gen}, {live} live documents, "
          f"{time.perf_counter() - t0:.2f} s")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """``retriever index delete``: delete ids (arguments and/or ``--ids`` file), one commit; unknown
    ids are reported (exit status 0 when at least the known ones were deleted)."""
    from retriever.index.readers import read_id_lines
    from retriever.index.updates import IndexUpdater

    ids = list(args.ids)
    if args.ids_file:
        ids += read_id_lines(args.ids_file)
    if not ids:
        raise ConfigError("no ids given: pass ids as arguments or --ids FILE (one id per line)")
    with IndexUpdater.open(args.dir) as u:
        rep = u.delete(ids)
        gen = u.commit()
    print(f"deleted {rep.deleted} document{'' if rep.deleted == 1 else 's'} from {args.dir}: generation {gen}")
    if rep.unknown:
        shown = ", ".join(map(repr, rep.unknown[:10])) + (" ..." if len(rep.unknown) > 10 else "")
        print(f"note: {len(rep.unknown)} ids name no live document: {shown}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """``retriever index compact``: :meth:`retriever.index.updates.IndexUpdater.compact`, one commit."""
    from retriever.index.updates import CompactPolicy, IndexUpdater

    defaults = CompactPolicy()
    policy = CompactPolicy(small_rows=defaults.small_rows if args.small_rows is None else args.small_rows,
                           max_deleted_fraction=defaults.max_deleted_fraction if args.max_deleted_fraction is None
                           else args.max_deleted_fraction)
    with IndexUpdater.open(args.dir) as u:
        rep = u.compact(policy, full=args.full)
    print(f"compacted {args.dir}: {len(rep.merged)} segments rewritten into {len(rep.written)}, "
          f"{rep.dropped_rows} deleted rows dropped, generation {rep.generation}, {rep.seconds:.2f} s")
    return 0


def _hit_dict(h) -> dict[str, Any]:
    return {"id": h.id, "rank": h.rank, "score": h.score, "title": h.title,
            "legs": {k: {"score": v.score, "rank": v.rank} for k, v in h.legs.items()}}


def cmd_search(args: argparse.Namespace) -> int:
    """``retriever search``: top-k hits of one query string, as a table or (``--json``) one JSON object; returns the exit status."""
    from .api import Retriever

    r = Retriever.open(args.dir, n_threads=args.threads)
    hits = r.search(args.query, k=args.k, mode=args.mode, fusion=_fusion(args), depth=args.depth,
                    leg_params=args.leg_params, filter=args.filter)
    if args.json:
        print(json.dumps({"query": args.query, "mode": args.mode, "hits": [_hit_dict(h) for h in hits]},
                         ensure_ascii=False))
        return 0
    for h in hits:
        legs = " ".join(f"{k}={v.score:.4f}(#{v.rank})" for k, v in h.legs.items())
        title = (h.title or h.text or "")[:70].replace("\n", " ")
        print(f"{h.rank:>3}  {h.score:10.4f}  {h.id:<20} {title}  [{legs}]")
    if not hits:
        print("no hits", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``retriever eval``: search every query of a file and report trec_eval measures (pytrec_eval) against qrels; returns the exit status."""
    from .api import Retriever
    from .evaluation import evaluate, read_labelled, search_run, write_trec_run

    queries, qrels = read_labelled(args.queries, args.qrels)
    if not queries:
        raise CorpusError("no queries to evaluate", path=args.queries)
    if not any(q in qrels for q in queries):
        raise CorpusError(f"none of the {len(queries)} queries has a judgement in {args.qrels} (query ids "
                          f"{sorted(queries)[:3]}..., qrels ids {sorted(qrels)[:3]}...)", path=args.queries)
    if args.run_out:
        parent = Path(args.run_out).parent
        if not parent.is_dir():
            raise ConfigError(f"--run-out: folder {str(parent)!r} does not exist")
    r = Retriever.open(args.dir, n_threads=args.threads)
    modes = list(dict.fromkeys(args.mode)) if args.mode else ([*r.legs, "hybrid"] if len(r.legs) > 1 else list(r.legs))
    qids = list(queries)
    fusion = _fusion(args)
    for mode in modes:
        t0 = time.perf_counter()
        run, res = search_run(r, queries, mode=mode, k=args.k, fusion=fusion, depth=args.depth,
                              leg_params=args.leg_params, filter=args.filter)
        secs = time.perf_counter() - t0
        m = evaluate(run, qrels, qids=qids)
        if args.run_out:
            path = Path(args.run_out if len(modes) == 1 else f"{args.run_out}.{mode}")
            try:
                write_trec_run(path, run, tag=f"retriever-{mode}")
            except OSError as e:
                raise ConfigError(f"--run-out: cannot write {str(path)!r} ({e.strerror or e})") from None
        row = {"mode": mode, "ndcg@10": round(m["ndcg@10"], 4), "recall@100": round(m["recall@100"], 4),
               "mrr@10": round(m["mrr@10"], 4), "queries": m["queries"], "seconds": round(secs, 3)}
        if res.fusion:
            row["fusion"] = res.fusion
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{mode:<8} nDCG@10 {row['ndcg@10']:.4f}  Recall@100 {row['recall@100']:.4f}  "
                  f"MRR@10 {row['mrr@10']:.4f}  ({row['queries']} queries, {secs:.1f} s)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``retriever bench``: QPS, latency percentiles (ms), recall against exact search, RSS and index size (see :mod:`retriever.bench`); returns the exit status."""
    from .api import Retriever
    from .bench import bench_index, format_report
    from .evaluation import read_query_file

    texts = list(read_query_file(args.queries).values())
    qv = None
    if args.query_vectors:
        qv = _load_npy(args.query_vectors, "--query-vectors", QueryError)
    if args.max_queries:
        texts = texts[:args.max_queries]
        qv = None if qv is None else qv[:args.max_queries]
    import os

    from .api import MAX_THREADS

    threads = min(args.threads or os.cpu_count() or 1, MAX_THREADS)
    r = Retriever.open(args.dir, n_threads=threads)
    if qv is not None:  # the file's own shape, named with the file (the engine checks one query at a time)
        dim = getattr(r.engine.legs.get("dense"), "dim", None)
        if qv.ndim != 2 or qv.shape[0] != len(texts) or (dim is not None and qv.shape[1] != dim):
            raise QueryError(f"--query-vectors: {args.query_vectors!r} holds shape {qv.shape}, expected "
                             f"({len(texts)}, {dim if dim is not None else 'dim'}): one row per query"
                             f"{' (after --max-queries)' if args.max_queries else ''}")
    rep = bench_index(r, texts, modes=args.mode, k=args.k, n_threads=threads, batch_size=args.batch_size,
                      query_vectors=qv, fusion=_fusion(args), depth=args.depth, recall=not args.no_recall,
                      filter=args.filter)
    print(json.dumps(rep, indent=1) if args.json else format_report(rep))
    return 0


def cmd_fusion_fit(args: argparse.Namespace) -> int:
    """``retriever fusion fit``: :func:`retriever.fusion_fit.fit_fusion` on a labelled split; prints the
    CV figure beside the default's and stores the chosen setting; returns the exit status."""
    from .api import Retriever
    from .evaluation import read_labelled
    from .fusion_fit import fit_fusion

    queries, qrels = read_labelled(args.queries, args.qrels)
    split = args.split or Path(args.queries).stem
    r = Retriever.open(args.dir, n_threads=args.threads)
    rep = fit_fusion(r, queries, qrels, metric=args.metric, folds=args.folds, k=args.k, split=split,
                     store=not args.dry_run, queries_path=args.queries, qrels_path=args.qrels, rule=args.rule)
    if args.json:
        print(json.dumps({**rep.stored(), "generation": rep.generation, "seconds": rep.seconds,
                          "cv_folds": rep.cv["folds"], "default_cv_folds": rep.default_cv["folds"]}))
    else:
        print(rep.summary())
        print(f"note: fitted on split {split!r}; report figures on a split it was not fitted on")
    return 0


def cmd_fusion_clear(args: argparse.Namespace) -> int:
    """``retriever fusion clear``: a new generation without a stored fusion setting; returns the exit status."""
    from .fusion_fit import store_fusion
    from .shards import IndexReader

    gen = store_fusion(args.dir, IndexReader(args.dir).generation, None)
    print(f"cleared the stored fusion setting (generation {gen})")
    return 0


COMMANDS = {("index", "build"): cmd_build, ("index", "info"): cmd_info, ("index", "verify"): cmd_verify,
            ("index", "upgrade"): cmd_upgrade, ("index", "add"): cmd_add, ("index", "upsert"): cmd_add,
            ("index", "delete"): cmd_delete, ("index", "compact"): cmd_compact,
            ("search", None): cmd_search, ("eval", None): cmd_eval,
            ("bench", None): cmd_bench, ("fusion", "fit"): cmd_fusion_fit, ("fusion", "clear"): cmd_fusion_clear}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: parse ``argv`` (default ``sys.argv[1:]``), run the sub-command; returns the exit status (a library error or OSError prints one ``error:`` line and returns 1; Ctrl-C returns 130; a closed output pipe, as with ``| head``, returns 141 quietly)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    fn = COMMANDS[(args.command, getattr(args, "index_command", None) or getattr(args, "fusion_command", None))]
    try:
        status = fn(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at the interpreter's exit
        return status
    except RetrieverError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our output went away (`retriever ... | head`): not an error to report
        # stdout onto /dev/null so that the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a tool killed by the signal reports to the shell
    except OSError as e:  # the environment, not a bug: a path that is a file, permissions, disk full
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
