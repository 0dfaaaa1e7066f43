"""Turn ``benchmarks/results/run_*.json`` into ``SUMMARY.md`` and recall–QPS / throughput plots.

Used by ``benchmarks/run.py`` and ``benchmarks/update_readme.py``; every function reads only the
JSON files, so the summary can be regenerated without rerunning anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def load(out: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """``{section: document}`` for every ``run_<section>.json`` in ``out``."""
    docs = {}
    for p in sorted(Path(out).glob("run_*.json")):
        try:
            docs[p.stem[4:]] = json.loads(p.read_text())
        except ValueError:
            continue
    return docs


def _f(x: Any, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _rec(r: dict | None) -> str:
    if not r:
        return "n/a"
    return ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a" for k, v in r.items())


def _where(doc: dict) -> str:
    m = doc.get("machine", {})
    return (f"`{doc.get('command', '')}` — {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
            f"load avg {m.get('load_avg_1m', '?')}, Python {m.get('python', '?')}, {m.get('date', '?')}"
            f"{' (quick sizes)' if doc.get('quick') else ''}")


def section_markdown(docs: dict[str, dict[str, Any]], detail: bool = True) -> str:
    """The Markdown body shared by SUMMARY.md and (``detail=False``: no per-nprobe table) the
    README section."""
    out: list[str] = []
    h = docs.get("hybrid")
    if h:
        first = next(iter(h["results"]["sizes"].values()), {}) if h["status"] == "ok" else {}
        legs_txt = " + ".join(first.get("legs", ["bm25", "dense"])).replace("bm25", "BM25")
        out += [f"### Hybrid end to end ({legs_txt}, top-10, RRF, query vectors given)", "", _where(h), ""]
        if h["status"] != "ok":
            out += [f"status: {h['status']} {h['results'].get('error', '')}", ""]
        else:
            out += ["| docs | dense index | threads | p50 ms | p99 ms | QPS | recall@10 (per leg, fused) | p99 ≤ 10 ms |",
                    "|---:|---|---:|---:|---:|---:|---|---|"]
            for n, e in h["results"]["sizes"].items():
                hl = e["headline"]
                out.append(f"| {int(n):,} | {e['dense_factory']} nprobe {hl['nprobe']} | {e['threads']} | "
                           f"{hl['p50_ms']:.2f} | {hl['p99_ms']:.2f} | {hl['qps']:,.0f} | {_rec(hl['recall@10'])} | "
                           f"{'yes' if hl['meets_target'] else 'no'} |")
            if not detail:
                out += ["", "Per-leg and per-nprobe figures: `benchmarks/results/SUMMARY.md`; recall–QPS plot: "
                        "`benchmarks/results/hybrid_recall_qps.png`."]
            out += [] if not detail else ["", "Per leg and per nprobe (latency per query, batch size 1; `encode` = BM25 query analysis, "
                    "dense encoding excluded):", "",
                    "| docs | mode | nprobe | p50 ms | p95 ms | p99 ms | encode p50 ms | QPS | recall@10 |",
                    "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
            for n, e in (h["results"]["sizes"].items() if detail else ()):
                b = e["bm25"]
                out.append(f"| {int(n):,} | bm25 | | {b['latency_ms']['p50']:.2f} | {b['latency_ms']['p95']:.2f} | "
                           f"{b['latency_ms']['p99']:.2f} | {b['encode_ms']['p50']:.2f} | {b['qps']:,.0f} | {_rec(b['recall@10'])} |")
                for p in e["points"]:
                    for mode in ("dense", "hybrid"):
                        m = p[mode]
                        out.append(f"| {int(n):,} | {mode} | {p['nprobe']} | {m['latency_ms']['p50']:.2f} | "
                                   f"{m['latency_ms']['p95']:.2f} | {m['latency_ms']['p99']:.2f} | "
                                   f"{m['encode_ms']['p50']:.2f} | {m['qps']:,.0f} | {_rec(m['recall@10'])} |")
                for v in e.get("variants", ()):  # same run: legs in sequence, other sparse knobs
                    m = v["hybrid"]
                    out.append(f"| {int(n):,} | hybrid, {v['label']} | {v['nprobe']} | {m['latency_ms']['p50']:.2f} | "
                               f"{m['latency_ms']['p95']:.2f} | {m['latency_ms']['p99']:.2f} | "
                               f"{m['encode_ms']['p50']:.2f} | {m['qps']:,.0f} | {_rec(m['recall@10'])} |")
            sizes = list(h["results"]["sizes"].values())
            out += ["", "Index size on disk / peak RSS of the benchmark process: " + "; ".join(
                f"{e['n_docs']:,} docs: {e['bytes_on_disk'] / 1e9:.2f} GB / {e['peak_rss_bytes'] / 1e9:.2f} GB ("
                + ("index loaded from the cache, so search only" if e.get("index_cached")
                   else "the process also built the index, so this is the build's peak") + ")"
                for e in sizes) + ". Learned-sparse leg: " + (f"included, searched with {sizes[0].get('sparse_params')}; the leg alone: " + "; ".join(
                                     f"{e['n_docs']:,} docs p50 {e['sparse_leg']['latency_ms']['p50']:.2f} ms, p99 "
                                     f"{e['sparse_leg']['latency_ms']['p99']:.2f} ms, recall@10 "
                                     f"{_rec(e['sparse_leg'].get('recall@10'))}" for e in sizes if "sparse_leg" in e)
                                 if "sparse" in sizes[0].get("legs", ()) else
                                 "not part of this benchmark yet (the index has legs "
                                 + ", ".join(sizes[0].get("legs", ())) + "), so the issue's three-leg "
                                 "p99 target is not measured here") + ".", ""]
    enc = docs.get("encode")
    if enc and enc["status"] == "ok":
        out += ["### Query encoding (on its own)", "", _where(enc), "",
                "| model | batch-1 p50 ms | batch-1 p99 ms | batch-32 queries/s |", "|---|---:|---:|---:|"]
        for name, m in enc["results"]["models"].items():
            if "batch1_latency_ms" in m:
                out.append(f"| {name} | {m['batch1_latency_ms']['p50']:.1f} | {m['batch1_latency_ms']['p99']:.1f} | "
                           f"{_f(m.get('batch32_queries_per_s'), ',.1f')} |")
            else:
                out.append(f"| {name} | {m.get('status', 'n/a')} | | |")
        out.append("")
    ix = docs.get("indexing")
    if ix and ix["status"] == "ok":
        r = ix["results"]
        out += ["### Indexing throughput", "", _where(ix), "",
                "| part | documents | docs/s | target |", "|---|---:|---:|---|"]
        for key, label in (("non_model_synthetic", "non-model (analyzer + postings + writing), synthetic text"),
                           ("non_model_scifact", "non-model, SciFact text")):
            e = r[key]
            out.append(f"| {label} | {e['n_docs']:,} | {e['docs_per_s']:,.0f} | ≥ 50,000: "
                       f"{'met' if e['meets_target'] else 'missed'} |")
            b = e.get("bm25s") or {}
            if "docs_per_s" in b:
                out.append(f"| bm25s tokenize + index, same texts (in memory, no files) | {e['n_docs']:,} | "
                           f"{b['docs_per_s']:,.0f} | |")
        for leg, label in (("dense", "all-MiniLM-L6-v2"), ("sparse", "SPLADE bert-tiny")):
            d = r.get(leg)
            if not d:
                continue
            where = f"{label}, max {d['max_length']} tokens, batch {d['batch_size']}"
            out += [f"| {leg}: raw encoder ({where}; tokenise + forward + pooling only) | {d['n_docs']:,} | "
                    f"{d['raw_encoder_docs_per_s']:,.1f} | |",
                    f"| {leg}: `build_index` BM25 + {leg}, same texts and batching (model load excluded) | "
                    f"{d['n_docs']:,} | {d['pipeline_docs_per_s']:,.1f} | ≥ 90% of raw: "
                    f"{d['pipeline_vs_raw']:.0%} |"]
            if d.get("sentence_transformers_docs_per_s"):
                out.append(f"| {leg}: sentence-transformers `encode()` (same model, texts, max length, batch) | "
                           f"{d['n_docs']:,} | {d['sentence_transformers_docs_per_s']:,.1f} | pipeline/ST = "
                           f"{d['pipeline_vs_sentence_transformers']:.2f} (≥ 1.0) |")
            bf = d.get("bfloat16")
            if bf:
                vs_st = (f"; {bf['vs_sentence_transformers']:.2f}× ST" if "vs_sentence_transformers" in bf else "")
                out.append(f"| {leg}: `build_index` with `DenseConfig(precision=\"bfloat16\")` (cosine to float32 "
                           f"≥ {bf['cosine_to_float32_min']:.5f}, mean {bf['cosine_to_float32_mean']:.6f}) | "
                           f"{d['n_docs']:,} | {bf['pipeline_docs_per_s']:,.1f} | "
                           f"{bf['vs_float32_pipeline']:.2f}× the float32 pipeline{vs_st} |")
        out.append("")
        for key in ("non_model_synthetic", "non_model_scifact"):
            e = r[key]
            if "tokens_per_s" in e:
                out.append(f"Non-model, {key.split('_')[-1]}: {e['n_tokens'] / e['n_docs']:.0f} terms/document (tokens left after stop words), "
                           f"{e['tokens_per_s'] / 1e6:.2f} M terms/s.")
        out.append("")
        bd = r["non_model_synthetic"]["breakdown_seconds"]
        out += ["Non-model time breakdown (synthetic): " + "; ".join(f"{k} {v:.2f} s" for k, v in bd.items()) + ".", ""]
    bm = docs.get("bm25")
    bm25_md = bm25_bench_markdown()
    if bm25_md:
        out += ["### BM25 vs bm25s vs rank-bm25 (top-10)", "", bm25_md, ""]
    elif bm and bm["status"] == "ok":
        out += ["### BM25 vs bm25s vs rank-bm25 (top-10, 1 thread)", "", _where(bm), "",
                "| collection | engine | QPS (end to end) | indexing docs/s |", "|---|---|---:|---:|"]
        for name, e in bm["results"]["collections"].items():
            o = e["retriever"]
            out.append(f"| {name} | retriever | {o['end_to_end_t1']['qps_median']:,.0f} | {o['index_docs_per_s']:,.0f} |")
            out.append(f"| {name} | retriever, 2 threads | {o['end_to_end_t2']['qps_median']:,.0f} | |")
            if "end_to_end_t1" in e.get("bm25s", {}):
                out.append(f"| {name} | bm25s (numba) | {e['bm25s']['end_to_end_t1']['qps_median']:,.0f} | "
                           f"{e['bm25s']['index_docs_per_s']:,.0f} |")
            if "qps_median" in e.get("rank_bm25", {}):
                out.append(f"| {name} | rank-bm25 ({e['rank_bm25']['queries_sampled']} queries) | "
                           f"{e['rank_bm25']['qps_median']:,.2f} | {e['rank_bm25']['index_docs_per_s']:,.0f} |")
        out.append("")
    dense_md = dense_bench_markdown()
    for leg in ("dense", "sparse"):
        d = docs.get(leg)
        rep = _sparse_report(d) if leg == "sparse" else None
        if leg == "dense" and dense_md:
            out += ["### Dense vs FAISS flat (Matryoshka funnel)", "", dense_md, ""]
        elif d and d["status"] == "ok" and rep and rep.get("results"):
            out += ["### Learned sparse (top-10, 1 thread)", "", _where(d), "", sparse_markdown(rep, detail=detail)]
        elif d:
            label = {"dense": "Dense vs FAISS flat", "sparse": "Learned sparse"}[leg]
            if d["status"] == "not available":
                out += [f"### {label}", "", f"not available: {d['results'].get('reason', '')}", ""]
            else:
                out += [f"### {label}", "", _where(d), "",
                        f"status {d['status']}; reports: {', '.join(d['results'].get('files', [])) or 'none'} "
                        f"(see `benchmarks/results/`).", ""]
    return "\n".join(out).rstrip() + "\n"


def _on(m: dict | None, date: Any = None) -> str:
    """"CPU, N cores, date" of a results file's machine record."""
    m = m or {}
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {str(date or m.get('date', '?'))[:10]}"


def readme_rows(out: Path = RESULTS) -> list[tuple[str, str, str, str]]:
    """The README's table of current figures: ``(figure, value, machine and date, command)`` rows
    read from the results files in ``out`` (``quality.json``, ``bm25.json``, ``run_*.json``,
    ``bench_dense.json``, ``updates_1m.json``), each with the command recorded in its file. A missing or failed section
    gives no rows."""
    out = Path(out)
    rows: list[tuple[str, str, str, str]] = []

    def read(name: str) -> dict | None:
        try:
            return json.loads((out / name).read_text())
        except (OSError, ValueError):
            return None

    q = read("quality.json")
    for r in (q or {}).get("rows", []):
        rows.append((f"{q['collection']} {r['label']}: nDCG@10 / Recall@100 / MRR@10 ({r['queries']} queries)",
                     f"{r['ndcg@10']:.4f} / {r['recall@100']:.4f} / {r['mrr@10']:.4f}",
                     _on(q.get("machine"), q.get("started")), f"`{r['command']}`"))
    bm = read("bm25.json")
    for name, c in (bm or {}).get("collections", {}).items():
        o, b, rb, ra = c["retriever"], c.get("bm25s", {}), c.get("rank_bm25", {}), c.get("ratios", {})
        h = c.get("head_to_head") or {}
        where, cmd = _on(c.get("machine"), c.get("started")), f"`{c['command']}`"
        qps = lambda e, k: _f((e.get(k) or {}).get("qps_median"))  # noqa: E731
        rows.append((f"BM25 top-10, {name} ({c['n_docs']:,} docs, {c['n_queries']:,} queries in one call): QPS end to end, "
                     "1 / 2 threads", f"{qps(o, 'end_to_end_t1')} / {qps(o, 'end_to_end_t2')}", where, cmd))
        vs = (f"{h['vs_bm25s_end_to_end_median']:.2f}× bm25s ({qps(b, 'end_to_end_t1')} QPS; median of "
              f"{h['rounds']} interleaved rounds)" if "vs_bm25s_end_to_end_median" in h else
              f"{ra.get('vs_bm25s_end_to_end', 0):.2f}× bm25s ({qps(b, 'end_to_end_t1')} QPS)")
        if "vs_rank_bm25" in ra:
            vs += f"; {ra['vs_rank_bm25']:,.0f}× rank-bm25"
        rows.append((f"BM25 speed-up, {name}, 1 thread, same analyzer settings", vs, where, cmd))
    h = read("run_hybrid.json")
    if h and h.get("status") == "ok":
        for n, e in h["results"]["sizes"].items():
            hl = e["headline"]
            fused = (hl.get("recall@10") or {}).get("fused")
            sp_ = e.get("sparse_params") or {}
            sp_txt = f", sparse {sp_['algorithm']} query_cut {sp_['query_cut']}" if "query_cut" in sp_ else ""
            rows.append((f"hybrid {' + '.join(e.get('legs', ()))}, RRF top-10, {int(n):,} docs ({e['dense_factory']} "
                         f"nprobe {hl['nprobe']}{sp_txt}), {e['threads']} threads, one query per call, query vectors given: "
                         "p50 / p99 latency, fused recall@10 vs exact", f"{hl['p50_ms']:.2f} / {hl['p99_ms']:.2f} ms, "
                         f"{_f(fused, '.3f')}", _on(e.get("machine") or h.get("machine")), f"`{h['command'].strip()}`"))
    ix = read("run_indexing.json")
    if ix and ix.get("status") == "ok":
        r, where, cmd = ix["results"], _on(ix.get("machine")), f"`{ix['command'].strip()}`"
        for key, label in (("non_model_synthetic", "synthetic text"), ("non_model_scifact", "SciFact text")):
            e = r.get(key)
            if e:
                rows.append((f"BM25-only indexing (analyzer, postings, files), {label}, {e['n_docs']:,} docs",
                             f"{e['docs_per_s']:,.0f} docs/s", where, cmd))
        d = r.get("dense")
        if d:
            val = f"{d['pipeline_docs_per_s']:,.1f} docs/s ({d['pipeline_vs_raw']:.0%} of the raw encoder"
            if d.get("pipeline_vs_sentence_transformers"):
                val += f", {d['pipeline_vs_sentence_transformers']:.2f}× sentence-transformers"
            bf = d.get("bfloat16")
            val += ")" + (f"; bfloat16 {bf['pipeline_docs_per_s']:,.1f} docs/s ({bf['vs_float32_pipeline']:.2f}×, "
                          f"cosine to float32 ≥ {bf['cosine_to_float32_min']:.5f})" if bf else "")
            rows.append((f"dense encoding in `build_index` (all-MiniLM-L6-v2, CPU, max {d['max_length']} tokens, "
                         f"batch {d['batch_size']}), {d['n_docs']:,} SciFact docs", val, where, cmd))
        s = r.get("sparse")
        if s:
            rows.append((f"SPLADE encoding in `build_index` (bundled 2-layer model, CPU), {s['n_docs']:,} SciFact docs",
                         f"{s['pipeline_docs_per_s']:,.1f} docs/s ({s['pipeline_vs_raw']:.0%} of the raw encoder)",
                         where, cmd))
    enc = read("run_encode.json")
    if enc and enc.get("status") == "ok":
        parts = [f"{name.split(':')[0]} {m['batch1_latency_ms']['p50']:.1f} ms"
                 for name, m in enc["results"]["models"].items() if "batch1_latency_ms" in m]
        if parts:
            rows.append(("query encoding, one query per call, p50 (dense MiniLM / SPLADE)", ", ".join(parts),
                         _on(enc.get("machine")), f"`{enc['command'].strip()}`"))
    dn = read("bench_dense.json")
    for d in (dn or {}).get("datasets", []):
        best, flat = d.get("best_at_recall_0.99"), d["rows"][0] if d.get("rows") else None
        if not best or not flat:
            continue
        cmd = dn["command"] + (f" {d['argv']}" if d.get("argv") else "")
        rows.append((f"dense funnel vs full-dim FAISS flat, {d['dataset']} ({d['n']:,} × {d['dim']}, "
                     f"{d['queries']:,} queries in one call), 1 thread: fastest at recall@10 ≥ 0.99",
                     f"{best['config']}: {best['qps']:,.0f} vs {flat['qps']:,.0f} QPS ({best['speedup']:.2f}×), "
                     f"recall {best['recall@10']:.4f}", f"{dn.get('machine', '?')}, {dn.get('cpus', '?')} cores, "
                     f"{dn.get('date', '?')}", f"`{cmd}`"))
    sp = read("run_sparse.json")
    rep = _sparse_report(sp) if sp and sp.get("status") == "ok" else None
    for c in (rep or {}).get("results", []):
        t = c.get("targets") or {}
        ex = next((x for x in c["rows"] if x.get("engine") == "retriever-exact" and "qps" in x), None)
        if not ex:
            continue
        val = f"exact {ex['cpu_qps']:,.0f} QPS" + (f" ({t['exact_over_scipy']:.1f}× scipy)" if "exact_over_scipy" in t else "")
        if t.get("approx"):
            ratios = [a["ratio"] for a in t["approx"]]
            val += (f"; approximate vs pyseismic at its points with recall ≥ 0.90: {min(ratios):.2f}–{max(ratios):.2f}× "
                    f"({len(ratios)} points)")
        rows.append((f"learned sparse top-10, {c['collection']} ({c['n_docs']:,} docs, {c['n_queries']:,} queries), 1 thread, "
                     "CPU-time QPS",
                     val, _on(sp.get("machine"), c.get("date")), f"`{c.get('command', sp['command']).strip()}`"))
    rows.extend(_living_rows(read("updates_1m.json"), read("updates_add_1m.json")))
    return rows


def _add_rate_row(u: dict | None) -> list[tuple[str, str, str, str]]:
    """The README row of a living-index add-rate run of several rounds (``updates_add_1m.json``:
    ``bench_updates --only build-add --repeat N``): medians and ranges over the rounds."""
    r = (u or {}).get("retriever") or {}
    med, rounds = r.get("median"), r.get("rounds")
    if not med or not rounds:
        return []
    ratio, cpu = med["ratio_to_fresh_build"], med["cpu_ratio_to_fresh_build"]
    val = (f"add / fresh build {ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f}), CPU time "
           f"{cpu['median']:.2f}× ({cpu['min']:.2f}–{cpu['max']:.2f}); add {med['add_docs_per_s']['median']:,.0f} docs/s, "
           f"fresh build {med['fresh_docs_per_s']['median']:,.0f} docs/s (medians of {ratio['n']} rounds)")
    n = rounds[0]["fresh_build"]["docs"]
    return [(f"living index add rate, synthetic {n:,} docs (BM25 + dense flat, half built then half added in "
             f"{rounds[0]['add']['batch']:,}-doc commits, no encoders; each round a fresh build and the adds)", val,
             _on(u.get("machine")), f"`{u['command'].strip()}`")]


def _living_rows(u: dict | None, add_rounds: dict | None = None) -> list[tuple[str, str, str, str]]:
    """The README rows of a full living-index run (``updates_1m.json`` of :mod:`benchmarks.bench_updates`):
    the add rate against a fresh build (the medians of ``add_rounds``, a run of several rounds, when
    given: one round's ratio moves by ±0.2 on these machines), the 1,000-document add / delete commits,
    the refresh, the compaction, and BM25 latency while a writer changes the index."""
    r = (u or {}).get("retriever") or {}
    need = ("fresh_build", "add", "add_1000", "delete_1000", "refresh_after_1000_s", "full_open_s", "compact_full",
            "query_ms")
    if any(k not in r for k in need):
        return _add_rate_row(add_rounds)
    # the cache folder of the recorded command is a scratch path of that machine: shown as DIR
    cmd = "`" + re.sub(r"--cache \S+", "--cache DIR", u["command"].strip()) + "`"
    where, n = _on(u.get("machine")), u.get("docs", 0)
    a, fb, d = r["add"], r["fresh_build"], r["delete_1000"]
    rate_rows = _add_rate_row(add_rounds)
    if rate_rows:
        val = "add rate: the next row; "
    else:
        cpu = f"; CPU time {a['cpu_ratio_to_fresh_build']:.2f}×" if "cpu_ratio_to_fresh_build" in a else ""
        val = (f"add {a['docs_per_s']:,.0f} docs/s = {a['ratio_to_fresh_build']:.2f}× a fresh build "
               f"({fb['docs_per_s']:,.0f}{cpu}); ")
    val += (f"add + commit 1,000 docs "
           f"{r['add_1000']['add_plus_commit_ms_median']:.0f} ms; delete 1,000 {1e3 * d['delete_s']['median']:.1f} ms + commit "
           f"{1e3 * d['commit_s']['median']:.0f} ms; refresh {1e3 * r['refresh_after_1000_s']['median']:.0f} ms (open "
           f"{r['full_open_s']['median']:.2f} s); full compaction {r['compact_full']['seconds']:.1f} s")
    q = r["query_ms"]
    st, wr = q["static"], q["while_writing"]
    val += (f"; BM25 top-10 p50 / p99 {st['p50']:.2f} / {st['p99']:.2f} ms static, {wr['p50']:.2f} / {wr['p99']:.2f} ms "
            f"while a writer adds + deletes {wr['docs_per_s']:,} docs/s (p99 {wr['p99'] / st['p99']:.2f}×)")
    return [(f"living index, synthetic {n:,} docs (BM25 + dense flat, half built then half added in {a['batch']:,}-doc "
             "commits, no encoders; one query at a time, the reader refreshing every second)", val, where, cmd),
            *rate_rows]


def readme_markdown(out: Path = RESULTS) -> str:
    """The README's figures: one Markdown table of :func:`readme_rows` ("" when there are none)."""
    rows = readme_rows(out)
    if not rows:
        return ""
    lines = ["| figure | value | machine, date | command |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def _knobs(r: dict) -> str:
    parts = [f"{k} {r[k]}" for k in ("n_postings", "query_cut", "heap_factor", "alpha") if k in r]
    return ", ".join(parts)


def _sparse_report(doc: dict | None) -> dict | None:
    """bench_sparse's report inside ``run_sparse.json``: ``sparse.json`` (full) or
    ``sparse_quick.json`` (``--quick``)."""
    reports = (doc or {}).get("results", {}).get("reports", {})
    return reports.get("sparse.json") or reports.get("sparse_quick.json")


def sparse_markdown(report: dict[str, Any], detail: bool = True) -> str:
    """Markdown of ``benchmarks/results/sparse.json`` (``benchmarks/bench_sparse.py``): per collection
    the recall–QPS curve of every engine (``detail=False``: only points with recall@10 >= 0.85 and
    the exact engines) and the targets."""
    out: list[str] = []
    for c in report.get("results", []):
        load = c.get("load_avg") or ["?"]
        out += [f"**{c['collection']}** — {c['n_docs']:,} documents ({c['nnz_per_doc']:.0f} non-zeros each), "
                f"{c['n_queries']:,} queries ({c['nnz_per_query']:.0f}); {c.get('date', '')}, load average "
                f"{load[0] if isinstance(load[0], str) else round(load[0], 2)}; `{c.get('command', '')}`", "",
                "| engine | knobs | QPS (wall) | QPS (CPU time) | recall@10 | build s | bytes / posting |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for r in c["rows"]:
            if "qps" not in r:
                out.append(f"| {r['engine']} | error: {r.get('error', '')} | | | | | |")
                continue
            if not detail and r["recall@10"] < 0.85 and "exact" not in r["engine"]:
                continue
            extra = f" ({r['queries']} queries)" if "queries" in r else ""
            out.append(f"| {r['engine']}{extra} | {_knobs(r)} | {r['qps']:,.0f} | {r['cpu_qps']:,.0f} | "
                       f"{r['recall@10']:.3f} | {_f(r.get('build_s'), ',.1f')} | "
                       f"{_f(r.get('bytes_per_posting'), '.2f')} |")
        t = c.get("targets") or {}
        if t:
            line = "Targets (CPU-time QPS): "
            if "exact_over_scipy" in t:
                line += (f"exact / scipy = {t['exact_over_scipy']:.1f}× (≥ 5×: "
                         f"{'met' if t['exact_met'] else 'missed'}); ")
            if t.get("approx"):
                worst = min(t["approx"], key=lambda a: a["ratio"])
                line += (f"approximate vs pyseismic at its {len(t['approx'])} points with recall ≥ 0.90: "
                         f"{'met at all' if t['approx_met'] else 'missed at some'} (lowest ratio "
                         f"{worst['ratio']:.2f}× at recall {worst['recall']:.3f}).")
            else:
                line += "approximate: pyseismic reached no recall ≥ 0.90 point."
            out += ["", line]
        out.append("")
    return "\n".join(out)

def bm25_bench_markdown(out: Path = RESULTS) -> str:
    """Markdown of ``benchmarks/results/bm25.json`` (``python -m benchmarks.bench_bm25``, one
    invocation per collection, merged): QPS of this engine (end to end and kernel, 1 and 2 threads),
    bm25s and rank-bm25 in the same run, ratios against the issue's targets; "" when the file is
    missing (the section then falls back to ``run_bm25.json``)."""
    p = out / "bm25.json"
    if not p.exists():
        return ""
    r = json.loads(p.read_text())
    q = lambda e, k: _f((e.get(k) or {}).get("qps_median"))  # noqa: E731
    lines = []
    for name, c in r.get("collections", {}).items():
        o, b, rb, ra = c["retriever"], c.get("bm25s", {}), c.get("rank_bm25", {}), c.get("ratios", {})
        m = c.get("machine", {})
        load = c.get("load_avg_before") or ["?"]
        lines += [f"**{name}** ({c['n_docs']:,} docs, {c['n_queries']:,} queries) — `{c['command']}`, "
                  f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, load {float(load[0]):.2f} at start, "
                  f"{c.get('started', m.get('date', '?'))}; QPS = median of 3 timed passes (each at least "
                  f"0.25 s of repeated batches, after a gc.collect()).", "",
                  "| engine | QPS end to end, 1 thread | 2 threads | kernel only (`auto`), 1 thread | 2 threads | indexing docs/s |",
                  "|---|---:|---:|---:|---:|---:|",
                  f"| retriever | {q(o, 'end_to_end_t1')} | {q(o, 'end_to_end_t2')} | {q(o, 'kernel_auto_t1')} | "
                  f"{q(o, 'kernel_auto_t2')} | {_f(o.get('index_docs_per_s'))} |",
                  f"| bm25s (numba, Lucene method) | {q(b, 'end_to_end_t1')} | | {q(b, 'retrieve_t1')} (retrieve only) | | "
                  f"{_f(b.get('index_docs_per_s'))} |"]
        if "qps_median" in rb:
            lines.append(f"| rank-bm25 (first {rb['queries_sampled']} queries) | {rb['qps_median']:,.2f} | | | | "
                         f"{_f(rb.get('index_docs_per_s'))} |")
        same = all(o.get(f"{a}_equals_exhaustive") for a in ("maxscore", "bmw", "bmm", "auto"))
        h = c.get("head_to_head")
        if h:
            vs, t2 = h["vs_bm25s_end_to_end"], h["two_threads_vs_one"]
            lines += ["", f"Interleaved ({h['rounds']} rounds, each one pass of retriever on 1 thread, bm25s, "
                      f"retriever on 2 threads; the figures to quote on a machine whose speed drifts): median "
                      f"per-round ratio **{h['vs_bm25s_end_to_end_median']:.2f}× bm25s** end to end "
                      f"(rounds {min(vs):.2f}–{max(vs):.2f}×), **two threads {h['two_threads_vs_one_median']:.2f}× "
                      f"one thread** (rounds {min(t2):.2f}–{max(t2):.2f}×)."]
        lines += ["", f"Ratios of the separate passes' medians: end to end {ra.get('vs_bm25s_end_to_end', 0):.2f}× bm25s (target ≥ 5×), "
                  + (f"{ra['vs_rank_bm25']:,.0f}× rank-bm25" if "vs_rank_bm25" in ra else "rank-bm25 not measured in this run")
                  + " (target ≥ 1000×); two threads "
                  f"{ra.get('kernel_two_threads_vs_one', 0):.2f}× one thread on the kernel, "
                  f"{ra.get('two_threads_vs_one', 0):.2f}× end to end (target ≥ 1.7×); pruned top-10 "
                  f"{'identical to' if same else 'DIFFERS from'} exhaustive for every query.", ""]
    return "\n".join(lines).rstrip()


def _build_s(v: Any) -> str:
    """Generator build time estimate (first call minus median call, seconds); below 0.1 s it is
    timing noise and shown as ``< 0.1``."""
    if v is None or v == "":
        return ""
    return "< 0.1" if float(v) < 0.1 else f"{float(v):,.1f}"


def _blas_note(blas: dict | None) -> str:
    """``bench_dense.json``'s BLAS setting in words ('' when not recorded)."""
    if not blas or not blas.get("OPENBLAS_CORETYPE"):
        return ""
    how = "set to numpy's detected core type" if blas.get("aligned") else "set by the caller"
    return f", OPENBLAS_CORETYPE={blas['OPENBLAS_CORETYPE']} ({how}, so FAISS's bundled OpenBLAS uses the same kernels)"


def dense_bench_markdown(out: Path = RESULTS) -> str:
    """Table of ``bench_dense.json`` (else ``bench_dense_quick.json``) written by
    ``benchmarks/bench_dense.py``: per dataset the full-dim flat baseline, the raw FAISS reference
    and every funnel row (recall@10 vs full-dim exact, QPS median, speedup, bytes/vector). Empty
    string when neither file exists."""
    for name in ("bench_dense.json", "bench_dense_quick.json"):
        p = Path(out) / name
        if p.is_file():
            break
    else:
        return ""
    r = json.loads(p.read_text())
    lines = [f"`{r['command']}` (results `benchmarks/results/{name}`) — {r.get('machine', '?')}, "
             f"{r.get('cpus', '?')} cores, {r.get('threads')} thread(s) for FAISS, BLAS and kernels, same query "
             f"batch for every row, QPS = median of {r.get('runs')} runs, FAISS {r.get('faiss', '?')}, "
             f"{r.get('date', '?')}{_blas_note(r.get('blas'))}. Target: recall@10 ≥ 0.99 at ≥ 4× the full-dim flat "
             f"QPS.", ""]
    for d in r["datasets"]:
        best = d.get("best_at_recall_0.99")
        verdict = (f"best at recall ≥ 0.99: {best['config']} — {best['speedup']}× → target "
                   f"{'met' if d.get('target_met') else 'missed'}" if best else "no row reaches recall 0.99")
        run = f"run with `{d['argv']}`; " if d.get("argv") else ""
        lines += [f"**{d['dataset']}** ({d['n']:,} × {d['dim']}, {d['queries']} queries; {run}load: "
                  f"{d.get('uptime', '?').split('load average:')[-1].strip()}); {verdict}.", "",
                  "| configuration | recall@10 | QPS | speedup | bytes/vector | generator build s (first call − median; < 0.1 = noise) |",
                  "|---|---|---|---|---|---|"]
        for row in d["rows"]:
            tq = row.get("timed_queries")
            cfg = row["config"] + (f" (timed on the first {tq} queries: a full scan costs the same for each)"
                                   if tq and tq < d["queries"] else "")
            lines.append(f"| {cfg} | {row['recall@10']:.4f} | {row['qps']:,.0f} | {row['speedup']:.2f}× | "
                         f"{row['bytes_per_vector']:,.0f} | {_build_s(row.get('build_s'))} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def budget_markdown(out: Path = RESULTS) -> list[str]:
    """The "Time budget" lines of SUMMARY.md from ``budget.json`` / ``budget_quick.json`` (written
    by ``benchmarks/run.py`` at the end of every invocation): the invocation's own wall time, per
    section, against the limit (60 min full, 5 min quick), and the cache state at its start. The
    latest partial invocation (``budget[_quick]_partial.json``, written by ``--only`` /
    ``--hybrid-sizes`` runs) gets a line of its own after the complete run's, never in its place.
    Quick records are read from ``out`` or, failing that, ``out/quick`` (the quick run's default
    folder)."""
    lines = []
    for name, label in (("budget.json", "Full run"), ("budget_partial.json", "Latest partial run"),
                        ("budget_quick.json", "Quick run"), ("budget_quick_partial.json", "Latest partial quick run")):
        p = Path(out) / name
        if not p.is_file() and "quick" in name:  # a quick run's default folder is results/quick
            p = Path(out) / "quick" / name
        if not p.is_file():
            if "partial" not in name:
                lines.append(f"- {label}: no invocation recorded yet.")
            continue
        try:
            b = json.loads(p.read_text())
        except ValueError:
            continue
        c = b.get("cache_at_start") or {}
        cache = ("cold cache (empty)" if c.get("cold") else
                 f"warm cache ({c.get('entries', '?')} entries, {(c.get('bytes') or 0) / 2**30:.1f} GiB)")
        secs = ", ".join(f"{k} {v / 60:.1f}" for k, v in (b.get("section_seconds") or {}).items())
        st = b.get("started") or {}
        what = ("all sections" if b.get("complete") else
                f"partial: only {', '.join(b.get('sections_run') or [])} (not a full-run figure)")
        verdict = ("under" if b.get("within_limit") else "NOT under") + f" {b.get('limit_minutes'):.0f} min"
        if b.get("complete") and b.get("aim_minutes"):
            verdict += f"; aim ≤ {b['aim_minutes']:.0f} min " + ("met" if b["wall_seconds"] / 60 <= b["aim_minutes"] else "missed")
        lines.append(f"- {label}: `{b.get('command')}` ({what}), {st.get('time', '?')}, load {st.get('load_avg_1m', '?')}, "
                     f"{st.get('cpu', st.get('cpu_model', '?'))}, {st.get('cores', st.get('cpu_count', '?'))} cores, "
                     f"{cache}: **{b['wall_seconds'] / 60:.1f} min wall**, {verdict}. Sections (min): {secs}.")
    return ["## Time budget", ""] + lines + [""]


def write_summary(out: Path = RESULTS) -> Path:
    docs = load(out)
    text = ["# Benchmark summary", "",
            "Generated by `python -m benchmarks.run` from `benchmarks/results/run_*.json`; plots: "
            "`hybrid_recall_qps.png`, `bm25_qps.png`, `indexing.png`.", ""]
    total = sum(d.get("seconds") or 0 for d in docs.values())
    text += [f"Sections: " + ", ".join(f"{k} ({d['status']}, {d.get('seconds') or 0:.0f} s)" for k, d in docs.items())
             + f"; total {total / 60:.1f} min (sum of each section's latest run; the runs may differ in "
             "date, machine load and cache state).", ""]
    text += budget_markdown(out) + [""]
    p = Path(out) / "SUMMARY.md"
    p.write_text("\n".join(text) + section_markdown(docs))
    return p


def _save(fig: Any, out: Path, name: str) -> Path:
    """Lay out, write ``out/name`` (PNG, 110 dpi) and close a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    p = Path(out) / name
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def write_plots(out: Path = RESULTS) -> list[Path]:
    """Recall–QPS (hybrid section), BM25 QPS per engine, indexing throughput; PNG via Agg."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = load(out)
    written = []
    h = docs.get("hybrid")
    if h and h["status"] == "ok":
        fig, ax = plt.subplots(figsize=(6, 4))
        for n, e in h["results"]["sizes"].items():
            for mode, key, marker in (("dense", "dense", "o"), ("hybrid", "fused", "s")):
                xs = [p[mode]["recall@10"].get(key) or 0 for p in e["points"]]
                ys = [p[mode]["qps"] for p in e["points"]]
                ax.plot(xs, ys, marker=marker, label=f"{mode} ({int(n):,} docs)")
                for p, x, y in zip(e["points"], xs, ys):
                    ax.annotate(str(p["nprobe"]), (x, y), fontsize=7)
            b = e["bm25"]
            ax.plot([b["recall@10"]["bm25"]], [b["qps"]], marker="^", linestyle="", label=f"bm25 ({int(n):,} docs)")
        ax.set_xlabel("recall@10 vs exact (fused list for hybrid)")
        ax.set_ylabel("QPS (batch 1, 2 threads)")
        ax.set_yscale("log")
        ax.set_title("Recall–QPS, IVF nprobe annotated")
        ax.legend(fontsize=7)
        written.append(_save(fig, out, "hybrid_recall_qps.png"))
    bm = docs.get("bm25")
    if (Path(out) / "bm25.json").exists():  # the full benchmark's results win over run.py's quick ones
        bm = {"status": "ok", "results": json.loads((Path(out) / "bm25.json").read_text())}
    if bm and bm["status"] == "ok":
        fig, ax = plt.subplots(figsize=(6, 4))
        names, vals = [], []
        for cname, e in bm["results"]["collections"].items():
            for eng, v in (("retriever", e["retriever"]["end_to_end_t1"]["qps_median"]),
                           ("bm25s", e.get("bm25s", {}).get("end_to_end_t1", {}).get("qps_median")),
                           ("rank-bm25", e.get("rank_bm25", {}).get("qps_median"))):
                if v:
                    names.append(f"{cname}\n{eng}")
                    vals.append(v)
        ax.bar(range(len(vals)), vals)
        ax.set_xticks(range(len(vals)), names, fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel("QPS (1 thread, top-10; exact, recall 1.0)")
        ax.set_title("BM25")
        written.append(_save(fig, out, "bm25_qps.png"))
    sp = docs.get("sparse")
    rep = _sparse_report(sp)
    if sp and sp["status"] == "ok" and rep and rep.get("results"):
        cols = rep["results"]
        fig, axes = plt.subplots(1, len(cols), figsize=(5.5 * len(cols), 4), squeeze=False)
        for ax, c in zip(axes[0], cols):
            for eng, marker in (("retriever-seismic", "o"), ("pyseismic", "s"), ("bmp", "^"),
                                ("retriever-exact", "*"), ("scipy-exact", "x")):
                pts = sorted((r["recall@10"], r["cpu_qps"]) for r in c["rows"] if r.get("engine") == eng and "qps" in r)
                if not pts:
                    continue
                if eng in ("retriever-seismic", "pyseismic"):  # the Pareto front of the sweep
                    front, best = [], 0.0
                    for x, y in sorted(pts, key=lambda p: -p[0]):
                        if y > best:
                            front.append((x, y))
                            best = y
                    ax.plot([p[0] for p in front], [p[1] for p in front], marker=marker, label=f"{eng} (front)")
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, linestyle="", alpha=0.25)
                else:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, linestyle="-" if len(pts) > 1 else "",
                            label=eng)
            ax.set_xlabel("recall@10 vs exact")
            ax.set_ylabel("QPS (1 thread, CPU time)")
            ax.set_yscale("log")
            ax.set_xlim(0.5, 1.01)
            ax.set_title(f"{c['collection']} ({c['n_docs']:,} docs)")
            ax.legend(fontsize=7)
        written.append(_save(fig, out, "sparse_recall_qps.png"))
    ix = docs.get("indexing")
    if ix and ix["status"] == "ok":
        r = ix["results"]
        items = [("non-model\nsynthetic", r["non_model_synthetic"]["docs_per_s"]),
                 ("non-model\nSciFact", r["non_model_scifact"]["docs_per_s"])]
        for leg in ("dense", "sparse"):
            d = r.get(leg)
            if d:
                items += [(f"{leg} raw\nencoder", d["raw_encoder_docs_per_s"]),
                          (f"{leg}\npipeline", d["pipeline_docs_per_s"])]
                if d.get("sentence_transformers_docs_per_s"):
                    items.append(("sentence-\ntransformers", d["sentence_transformers_docs_per_s"]))
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(range(len(items)), [v for _, v in items])
        ax.set_xticks(range(len(items)), [k for k, _ in items], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("documents/s")
        ax.set_title("Indexing throughput")
        written.append(_save(fig, out, "indexing.png"))
    return written
