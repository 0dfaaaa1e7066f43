"""Ray scale-out (issue 25): what going through Ray costs on one machine, and the inputs of the
N-machine model of ``docs/DISTRIBUTED.md``.

One run measures, in the same process and Ray cluster (``ray.init(num_cpus=2)``, started here and
shut down at the end):

1. **Build** docs/s of a one-process ``build_index`` and of ``build_index(...,
   executor=RayExecutor(num_workers=w))`` for w = 1, 2, in interleaved rounds:
   (a) *encoder on*: the first ``--build-docs`` SciFact documents, legs bm25 + dense (the bundled
   all-MiniLM-L6-v2 encodes them); (b) *pipeline only*: the search corpus below, leg bm25 (read,
   analyse, write: no model), because a Ray build cannot take precomputed vectors. Each Ray-built
   index is checked to have the one-process index's shard files byte for byte.
2. **Hybrid search** (BM25 + dense, RRF, k = 10, depth 100) on a seeded synthetic corpus
   (``benchmarks.datasets.synthetic_hybrid``: Zipfian text, clustered 384-d unit vectors, given to
   the build as ``dense_vectors`` and to the search as ``query_vectors``, so no encoder runs) of
   ``--docs`` documents in ``--shards`` shards: one process, then 1 and 2 Ray actors holding the
   shards. Per round and engine (the engine order rotates each round): QPS of batches of
   ``--batch`` queries, then p50 / p99 of one query at a time. Every timed result is compared with
   the one-process result (ids, fused scores, every leg's scores): the figures are for correct
   results, and the run fails otherwise.
3. **Model inputs**: per search call the milliseconds inside each actor (the actors time their
   calls, :meth:`DistributedEngine.actor_timings`), the bytes of each call's request and reply
   (Ray's own serialisation of the objects shipped: the call's arguments with the prepared query
   batch, inline or put in the object store as the engine chooses, and the top-k reply), the driver's merge of the actors' lists and
   the fusion, a no-op actor round trip, and each leg's per-shard search time in one process;
   then :func:`scale_model` evaluates the N-machine model with them (``--model-from FILE``
   recomputes it from an earlier results file without measuring).

Run:  flock /tmp/bench.lock python -m benchmarks.bench_ray [--docs 30000 --shards 6 --queries 300
      --batch 25 --rounds 7 --build-docs 128 --build-shard-size 32 --build-rounds 2 --pipeline-rounds 3]
      [--out benchmarks/results/ray_search.json]   (the defaults; about 5 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import DATA, synthetic_hybrid
from benchmarks.timing import machine

#: the search measured: hybrid, RRF, k and depth
K, DEPTH = 10, 100


def _spread(xs: list[float]) -> dict[str, float]:
    """Median with the min-max spread of ``xs``."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _scifact_subset(n: int, out: Path) -> Path:
    """The first ``n`` SciFact documents as a BEIR folder."""
    from retriever.index.readers import read_corpus

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, d in enumerate(read_corpus(DATA / "scifact")):
            if i >= n:
                break
            f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n")
    return out


def _same_files(a: Path, b: Path) -> bool:
    """Every shard file of index ``b`` equals index ``a``'s byte for byte (and the same files)."""
    fa = sorted(p.relative_to(a) for p in (a / "shards").rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in (b / "shards").rglob("*") if p.is_file())
    return fa == fb and all((a / p).read_bytes() == (b / p).read_bytes() for p in fa)


def _builds(corpus: Path, tmp: Path, cfg: dict[str, Any], n_docs: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of a one-process build and Ray builds with 1 and 2 workers."""
    from retriever import RayExecutor, build_index

    names = ["one_process", "ray_1", "ray_2"]
    secs: dict[str, list[float]] = {n: [] for n in names}
    built: dict[str, list[Path]] = {n: [] for n in names[1:]}  # compared with the reference at the end
    ref = tmp / "ref"
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            out = tmp / f"{name}-{r}"
            ex = None if name == "one_process" else RayExecutor(num_workers=int(name[-1]))
            t = time.perf_counter()
            build_index(corpus, out, executor=ex, **cfg)
            secs[name].append(time.perf_counter() - t)
            print(f"  build {name} round {r}: {secs[name][-1]:.1f} s", flush=True)
            if name == "one_process" and not ref.exists():
                out.rename(ref)
                continue
            if name != "one_process":
                built[name].append(out)
            else:
                shutil.rmtree(out)
    res: dict[str, Any] = {}
    for name in names:
        res[name] = {"seconds": _spread(secs[name]), "docs_per_s": _spread([n_docs / s for s in secs[name]])}
    for name, outs in built.items():
        res[name]["identical_shard_files"] = all(_same_files(ref, o) for o in outs)
        for o in outs:
            shutil.rmtree(o)
    shutil.rmtree(ref)
    return res


def _same(a: Any, b: Any) -> bool:
    """Ids, fused scores and each leg's scores of two batch results, bit for bit."""
    return (np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores, equal_nan=True)
            and a.legs.keys() == b.legs.keys()
            and all(np.array_equal(a.legs[n].scores, b.legs[n].scores, equal_nan=True) for n in a.legs))


def _search_pass(r: Any, queries: list[str], qv: np.ndarray, batch: int, ref_batch: list[Any],
                 ref_one: list[Any]) -> tuple[float, list[float], bool]:
    """One timed pass: (batch QPS, per-query ms one query at a time, every result identical)."""
    outs = []
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        outs.append(r.search_arrays(queries[i:i + batch], K, mode="hybrid", fusion="rrf", depth=DEPTH,
                                    query_vectors=qv[i:i + batch]))
    qps = len(queries) / (time.perf_counter() - t0)
    ok = all(_same(a, b) for a, b in zip(outs, ref_batch))
    lat, ones = [], []
    for i, q in enumerate(queries):
        t = time.perf_counter()
        ones.append(r.search_arrays([q], K, mode="hybrid", fusion="rrf", depth=DEPTH, query_vectors=qv[i:i + 1]))
        lat.append((time.perf_counter() - t) * 1e3)
    ok = ok and all(_same(a, b) for a, b in zip(ones, ref_one))
    return qps, lat, ok


def _serialized_bytes(obj: Any) -> int:
    """Bytes of ``obj`` as Ray serialises it (pickle 5 with out-of-band buffers, and its framing)."""
    from ray._private.worker import global_worker

    return int(global_worker.get_serialization_context().serialize(obj).total_bytes)


def _wire(r: Any, queries: list[str], qv: np.ndarray, nq: int) -> dict[str, Any]:
    """Per leg and actor the bytes one search call of ``nq`` queries ships, measured from the
    objects :meth:`DistributedEngine.gather` sends: the call's arguments (the actor's spec, leg,
    the prepared query batch (inside the call, or put once in the object store when large),
    depth, threads, masks, shard list), and the actor's reply (its top-depth ids, scores, counts); plus
    the driver's merge of the actors' replies (ms)."""
    import ray

    from retriever.distributed.search import INLINE_BYTES, payload_bytes
    from retriever.legs.base import SearchContext
    from retriever.params import defaults_for
    from retriever.topk import merge_topk

    eng = r.engine
    out: dict[str, Any] = {}
    for name, leg in eng.legs.items():
        prep = (leg.prepare_vectors(qv[:nq], defaults_for(name), 2) if name == "dense"
                else leg.prepare(queries[:nq], defaults_for(name), 2))
        put = len(eng.assignment) > 1 and payload_bytes(prep) > INLINE_BYTES  # as gather() chooses
        shipped = ray.put(prep) if put else prep
        per_actor, merge_ms = [], []
        parts = []
        for a, held in enumerate(eng.assignment):
            args = (eng.specs[a], name, shipped, DEPTH, 2, None, None)
            parts.append(ray.get(eng.actors[a].search.remote(*args)))
            per_actor.append({"request_bytes": _serialized_bytes(args) + (_serialized_bytes(prep) if put else 0),
                              "prepared_batch_bytes": _serialized_bytes(prep), "put_in_object_store": put,
                              "reply_bytes": _serialized_bytes(parts[-1])})
        for _ in range(50):
            t = time.perf_counter()
            merge_topk(parts, DEPTH)
            merge_ms.append((time.perf_counter() - t) * 1e3)
        ctx = SearchContext(depth=DEPTH, n_threads=2)
        assert all(np.array_equal(x, y) for x, y in zip(merge_topk(parts, DEPTH), leg.search_shards(
            prep, range(leg.n_shards), ctx))), "gathered lists differ from the engine's"
        out[name] = {"per_actor": per_actor, "merge_ms": _spread(merge_ms)}
    eng.actor_timings()  # forget these calls
    return out


def _actor_ms(timings: list[list[tuple[str, int, int, float]]]) -> dict[str, Any]:
    """Per leg and actor: median ms inside the actor per call, and per call per shard."""
    out: dict[str, Any] = {}
    for a, calls in enumerate(timings):
        for leg in sorted({c[0] for c in calls}):
            mine = [c for c in calls if c[0] == leg]
            out.setdefault(leg, []).append({
                "actor": a, "calls": len(mine), "queries_per_call": statistics.median(c[1] for c in mine),
                "shards": statistics.median(c[2] for c in mine),
                "ms_per_call": _spread([c[3] for c in mine]),
                "ms_per_call_per_shard": statistics.median(c[3] / max(c[2], 1) for c in mine)})
    return out


def _rtt_ms(actor: Any, n: int = 200) -> dict[str, float]:
    """A no-op actor call (``pid``): Ray's round trip on this machine."""
    import ray

    ray.get(actor.pid.remote())
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        ray.get(actor.pid.remote())
        xs.append((time.perf_counter() - t) * 1e3)
    return _spread(xs)


def _per_shard_local(r: Any, queries: list[str], qv: np.ndarray, nq: int) -> dict[str, Any]:
    """Each leg's one-process search ms per query per shard (2 threads, batches of ``nq``)."""
    from retriever.legs.base import SearchContext
    from retriever.params import defaults_for

    out: dict[str, Any] = {}
    ctx = SearchContext(depth=DEPTH, n_threads=2)
    for name, leg in r.engine.legs.items():
        prep = (leg.prepare_vectors(qv[:nq], defaults_for(name), 2) if name == "dense"
                else leg.prepare(queries[:nq], defaults_for(name), 2))
        ms = []
        for s in range(leg.n_shards):
            leg.search_shard(prep, s, ctx)
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                leg.search_shard(prep, s, ctx)
                ts.append((time.perf_counter() - t) * 1e3 / nq)
            ms.append(min(ts))
        out[name] = {"ms_per_query_per_shard": _spread(ms)}
    return out


def scale_model(res: dict[str, Any], machines: tuple[int, ...] = (1, 2, 4, 6, 8, 16, 32, 64),
                docs: tuple[int, ...] = (30_000, 1_000_000)) -> dict[str, Any]:
    """The N-machine model of ``docs/DISTRIBUTED.md`` evaluated with this run's measured inputs:
    corpora of ``docs`` documents in shards of the run's shard size (S shards), on N machines like
    this one (one actor each, holding ceil(S / N) shards; at most S machines), hybrid bm25 + dense,
    k = 10, depth 100.

    Inputs (all measured in ``res``): ``w1[leg]`` = ms per shard of one one-query call inside the
    single actor of ``ray_1`` (one actor alone on the machine); ``wb[leg]`` = the same per query in
    batches; ``fixed`` = ``ray_1``'s one-query total minus its actor time (the slowest leg's call)
    and the fusion: the driver's share (Ray calls, merge, threads) plus one round trip;
    ``per_actor`` = the driver cost of one more actor's calls, taken as the no-op round trip per
    leg; bytes of one query's request and reply per actor and leg. Legs run side by side on an
    actor (one-query latency: the slower leg; throughput: the sum, as measured with the legs
    sharing this machine's cores). Per-shard work scales with shard size, so the shard size is kept.

    Returns:
        ``inputs``, and per corpus size and N: ``latency_ms``, ``qps_actor_bound``,
        ``qps_driver_bound``, ``qps`` (the smaller), ``driver_in_mb_per_s_at_qps`` (replies into
        the driver), ``bytes_per_query_per_actor``.
    """
    s1 = res["search"]["ray_1"]
    n_shards = int(res["search_index"]["shards"])
    legs = sorted(s1["actor_ms"]["one_query"])
    w1 = {g: s1["actor_ms"]["one_query"][g][0]["ms_per_call_per_shard"] for g in legs}
    q_b = s1["actor_ms"]["batch"][legs[0]][0]["queries_per_call"]
    wb = {g: s1["actor_ms"]["batch"][g][0]["ms_per_call_per_shard"] / q_b for g in legs}
    actor_one = max(s1["actor_ms"]["one_query"][g][0]["ms_per_call"]["median"] for g in legs)
    mi = res["model_inputs"]
    fuse = mi["driver"]["ray_1"]["fuse_ms"]["median"]
    fixed = mi["driver"]["ray_1"]["one_query_total_ms"]["median"] - actor_one - fuse
    rtt = mi["rtt_ms"]["ray_1"]["median"]
    b1 = mi["bytes_and_merge"]["ray_1"]["nq_1"]
    bb = mi["bytes_and_merge"]["ray_1"][f"nq_{int(q_b)}"]
    req1 = sum(b1[g]["per_actor"][0]["request_bytes"] for g in legs)
    rep1 = sum(b1[g]["per_actor"][0]["reply_bytes"] for g in legs)
    reqb = sum(bb[g]["per_actor"][0]["request_bytes"] for g in legs) / q_b
    repb = sum(bb[g]["per_actor"][0]["reply_bytes"] for g in legs) / q_b
    merge_b = sum(mi["bytes_and_merge"]["ray_2"][f"nq_{int(q_b)}"][g]["merge_ms"]["median"] for g in legs) / q_b
    out: dict[str, Any] = {"inputs": {
        "shards_measured": n_shards, "w_one_query_ms_per_shard": w1,
        "w_batch_ms_per_query_per_shard": wb, "batch": q_b, "fixed_ms": fixed, "fuse_ms": fuse,
        "per_actor_call_ms": rtt, "merge_ms_per_query_batch_2_actors": merge_b,
        "bytes_per_query_per_actor_one_query": {"request": req1, "reply": rep1},
        "bytes_per_query_per_actor_batch": {"request": reqb, "reply": repb}}}
    shard_size = int(res["search_index"]["shard_size"])
    for nd in docs:
        total = -(-nd // shard_size)
        rows: dict[int, Any] = {}
        for n in machines:
            if n > total:
                break
            held = -(-total // n)
            latency = fixed + (n - 1) * rtt * len(legs) + held * max(w1.values()) + fuse
            qps_actor = 1e3 / (held * sum(wb.values()))
            qps_driver = 1e3 / (merge_b + fuse + n * len(legs) * rtt / q_b)
            qps = min(qps_actor, qps_driver)
            rows[n] = {"shards_per_actor": held, "latency_ms": latency, "qps_actor_bound": qps_actor,
                       "qps_driver_bound": qps_driver, "qps": qps, "driver_in_mb_per_s_at_qps": qps * n * repb / 1e6}
        out[f"docs_{nd}"] = {"shards": total, "per_machines": rows}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=30000, help="documents of the synthetic search corpus")
    ap.add_argument("--shards", type=int, default=6)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--build-docs", type=int, default=128, help="SciFact documents of the encoder-on build (0: skip)")
    ap.add_argument("--build-shard-size", type=int, default=32)
    ap.add_argument("--build-rounds", type=int, default=2)
    ap.add_argument("--pipeline-rounds", type=int, default=3, help="rounds of the bm25-only build (0: skip)")
    ap.add_argument("--out", default="benchmarks/results/ray_search.json")
    ap.add_argument("--model-from", default=None, help="an earlier run's results: recompute its N-machine model only")
    args = ap.parse_args(argv)
    if args.model_from:
        res = json.loads(Path(args.model_from).read_text())
        res["model"] = scale_model(res)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res["model"], indent=1))
        return 0

    import ray

    from retriever import RayExecutor, Retriever, build_index

    tmp = Path(tempfile.mkdtemp(prefix="bench_ray_"))
    res: dict[str, Any] = {"command": "python -m benchmarks.bench_ray " + " ".join(argv or sys.argv[1:]),
                           "machine": machine(), "args": vars(args), "build": {}, "search": {}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, logging_level="ERROR")
    try:
        shard_size = -(-args.docs // args.shards)
        coll = synthetic_hybrid(args.docs, n_queries=args.queries)
        folder = tmp / "synthetic"
        folder.mkdir()
        with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
            for d in coll.text.docs():
                f.write(json.dumps(d) + "\n")
        vecs = np.concatenate(list(coll.dense.blocks()))
        queries, qv = coll.text.queries, coll.dense.queries.astype(np.float32)
        # --- builds
        if args.build_docs:
            sci = _scifact_subset(args.build_docs, tmp / "scifact")
            print("build, encoder on", flush=True)
            res["build"]["encoder_on"] = {
                "corpus": f"SciFact, first {args.build_docs} documents", "legs": ["bm25", "dense"],
                "shard_size": args.build_shard_size,
                **_builds(sci, tmp / "b1", {"legs": ("bm25", "dense"), "shard_size": args.build_shard_size,
                                            "show_progress": False}, args.build_docs, args.build_rounds)}
        if args.pipeline_rounds:
            print("build, pipeline only", flush=True)
            res["build"]["pipeline_only"] = {
                "corpus": f"synthetic, {args.docs} documents", "legs": ["bm25"], "shard_size": shard_size,
                **_builds(folder, tmp / "b2", {"legs": ("bm25",), "shard_size": shard_size, "show_progress": False},
                          args.docs, args.pipeline_rounds)}
        print(json.dumps(res["build"], indent=1), flush=True)
        # --- the search index: text + the corpus's vectors (no encoder)
        t = time.perf_counter()
        idx = tmp / "search"
        build_index(folder, idx, legs=("bm25", "dense"), shard_size=shard_size, dense_vectors=vecs,
                    show_progress=False)
        res["search_index"] = {"docs": args.docs, "shards": args.shards, "shard_size": shard_size,
                               "legs": ["bm25", "dense (precomputed 384-d vectors, float16)"],
                               "build_seconds": time.perf_counter() - t}
        # actors ask for half a CPU so that the 1-actor and 2-actor engines fit side by side on 2 CPUs
        engines = {"one_process": Retriever.open(idx, n_threads=2)}
        for w in (1, 2):
            engines[f"ray_{w}"] = Retriever.open(idx, n_threads=2, executor=RayExecutor(
                num_workers=w, num_cpus_per_worker=0.5))
        one = engines["one_process"]
        ref_batch = [one.search_arrays(queries[i:i + args.batch], K, mode="hybrid", fusion="rrf", depth=DEPTH,
                                       query_vectors=qv[i:i + args.batch]) for i in range(0, len(queries), args.batch)]
        ref_one = [one.search_arrays([q], K, mode="hybrid", fusion="rrf", depth=DEPTH, query_vectors=qv[i:i + 1])
                   for i, q in enumerate(queries)]
        names = list(engines)
        raw = {n: {"qps": [], "p50_ms": [], "p99_ms": [], "identical": True} for n in names}
        timings: dict[str, list[list[Any]]] = {n: [] for n in names[1:]}
        for n in names[1:]:
            engines[n].engine.actor_timings()
        for r in range(args.rounds + 1):  # round 0 warms every engine up, untimed
            for name in names[r % 3:] + names[:r % 3]:
                qps, lat, ok = _search_pass(engines[name], queries, qv, args.batch, ref_batch, ref_one)
                if name != "one_process":
                    t_act = engines[name].engine.actor_timings()
                    if r:
                        timings[name].append(t_act)
                if not r:
                    continue
                raw[name]["qps"].append(qps)
                raw[name]["p50_ms"].append(float(np.percentile(lat, 50)))
                raw[name]["p99_ms"].append(float(np.percentile(lat, 99)))
                raw[name]["identical"] = raw[name]["identical"] and ok
            print(f"  search round {r}: " + ", ".join(
                f"{n} {raw[n]['qps'][-1]:.0f} QPS p50 {raw[n]['p50_ms'][-1]:.2f} ms" for n in names if raw[n]["qps"]),
                flush=True)
        for name in names:
            s = raw[name]
            res["search"][name] = {"identical_to_one_process": s["identical"], "qps": _spread(s["qps"]),
                                   "p50_ms": _spread(s["p50_ms"]), "p99_ms": _spread(s["p99_ms"])}
            if name != "one_process":
                res["search"][name]["assignment"] = engines[name].engine.assignment
                # the actors' calls of the timed passes: batch calls and one-query calls apart
                flat = [[c for t in timings[name] for c in t[a]] for a in range(len(engines[name].engine.actors))]
                res["search"][name]["actor_ms"] = {
                    "batch": _actor_ms([[c for c in calls if c[1] > 1] for calls in flat]),
                    "one_query": _actor_ms([[c for c in calls if c[1] == 1] for calls in flat])}
        if not all(raw[n]["identical"] for n in names):
            raise SystemExit("Ray search results differ from one process: figures not valid")
        print(json.dumps(res["search"], indent=1), flush=True)
        # --- model inputs
        model: dict[str, Any] = {"bytes_and_merge": {}, "rtt_ms": {}, "driver": {}}
        for name in names[1:]:
            model["bytes_and_merge"][name] = {f"nq_{nq}": _wire(engines[name], queries, qv, nq) for nq in (1, args.batch)}
            model["rtt_ms"][name] = _rtt_ms(engines[name].engine.actors[0])
        model["per_shard_one_process"] = {f"nq_{nq}": _per_shard_local(one, queries, qv, nq) for nq in (1, args.batch)}
        for name in names:
            rr = engines[name]
            fuse, enc, total = [], [], []
            for i, q in enumerate(queries[:100]):
                t = time.perf_counter()
                b = rr.search_arrays([q], K, mode="hybrid", fusion="rrf", depth=DEPTH, query_vectors=qv[i:i + 1])
                total.append((time.perf_counter() - t) * 1e3)
                fuse.append(b.timings_ms.get("fuse", 0.0))
                enc.append(b.timings_ms.get("encode", 0.0))
            model["driver"][name] = {"one_query_total_ms": _spread(total), "fuse_ms": _spread(fuse),
                                     "prepare_ms": _spread(enc)}
        res["model_inputs"] = model
        res["model"] = scale_model(res)
        print(json.dumps({"model_inputs": model, "model": res["model"]}, indent=1), flush=True)
        for rr in engines.values():
            rr.close()
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
