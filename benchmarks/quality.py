"""Record the README's retrieval-quality figures: run ``retriever eval`` on SciFact, one mode per
command, and write ``benchmarks/results/quality.json`` (each row with the exact command that made it).

The index is the one the README's quick start builds (``retriever index build --corpus
../shared/data/scifact --out idx/scifact``: BM25 + dense); this script only evaluates it, so build it
first. Rows: BM25, dense, hybrid RRF (the default fusion) and hybrid linear z-score; each row holds
nDCG@10, Recall@100 and MRR@10 over the judged test queries (trec_eval's conventions, see
:func:`retriever.evaluation.evaluate`).

Usage: ``python -m benchmarks.quality [--index idx/scifact] [--data ../shared/data] [--out FILE]``
(``--data`` defaults to ``$RETRIEVER_DATA``, else ``../shared/data``). The commands are recorded with
the paths as given, so run it with relative paths to keep machine paths out of the results.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.timing import machine

RESULTS = Path(__file__).resolve().parent / "results"

#: (label, extra ``retriever eval`` arguments) for every row, in README order
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("BM25 (k1 0.9, b 0.4, Lucene norms)", ("--mode", "bm25")),
    ("dense, all-MiniLM-L6-v2 (float16 vectors)", ("--mode", "dense")),
    ("hybrid, RRF k = 60, depth 100", ("--mode", "hybrid", "--fusion", "rrf")),
    ("hybrid, linear z-score", ("--mode", "hybrid", "--fusion", "linear:zscore")),
)


def eval_row(argv: list[str]) -> dict[str, Any]:
    """Run ``retriever eval ARGV --json`` in this process and return its one JSON row.

    Raises:
        RuntimeError: the command failed (non-zero exit status) or printed no single JSON row;
            the message names the command and its output.
    """
    from retriever.cli import main as cli_main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = cli_main(["eval", *argv, "--json"])
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    if rc != 0 or len(lines) != 1:
        raise RuntimeError(f"`retriever eval {shlex.join(argv)} --json` exited {rc}: "
                           f"{(err.getvalue() or buf.getvalue()).strip()!r}")
    return json.loads(lines[0])


def run(index: str, data: str) -> dict[str, Any]:
    """Evaluate every row of :data:`ROWS` on ``index`` with SciFact's test queries and qrels
    under ``data``; returns the document written to ``quality.json``."""
    queries, qrels = f"{data}/scifact/queries.jsonl", f"{data}/scifact/qrels.tsv"
    for p in (index, queries, qrels):
        if not Path(p).exists():
            raise SystemExit(f"error: {p} does not exist (build the index with the README's quick start first)")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for label, extra in ROWS:
        argv = [index, "--queries", queries, "--qrels", qrels, *extra]
        rows.append({"label": label, "command": f"retriever eval {shlex.join(argv)}", **eval_row(argv)})
    return {"collection": "scifact", "index": index, "command": "python -m benchmarks.quality",
            "machine": machine(), "started": started, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", default="idx/scifact", help="index built by the README's quick start")
    ap.add_argument("--data", default=os.environ.get("RETRIEVER_DATA", "../shared/data"),
                    help="folder holding scifact/ (default: $RETRIEVER_DATA, else ../shared/data)")
    ap.add_argument("--out", default=str(RESULTS / "quality.json"))
    args = ap.parse_args(argv)
    doc = run(args.index, args.data)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        print(f"{r['label']:<45} nDCG@10 {r['ndcg@10']:.4f}  Recall@100 {r['recall@100']:.4f}  MRR@10 {r['mrr@10']:.4f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
