"""The compiled batch analyzer (index/analyzer_kernels.py) against the Python analyzer it mirrors:
token streams, first-occurrence order, and the postings / vocabulary the builder produces."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retriever.index.analyzer as analyzer_mod
from retriever.index.analyzer import Analyzer
from retriever.index.analyzer_kernels import csr_by_term, utf8_arrays
from retriever.index.bm25_build import PostingsBuilder
from retriever.index.config import AnalyzerConfig

# characters around every rule: word runs, joiners (. ' ’ ,), digits, case folding that changes
# length (ß, ﬁ, İ), final sigma, combining marks, ideographs / Hiragana, astral characters
# (Python fallback), the possessive, separators
SPECIAL = list("aAzZsS09_ .'’,-\t\n") + ["'s", "’S", "ß", "ﬁ", "İ", "ı", "Σ", "ς", "K", "é", "e\u0301", "ǅ",
                                         "中", "本", "ぁ", "ゟ", "ア", "한", "٣", "²", "½", "😀", "𠀀", "\u00a0",
                                         "3,5", "1.2", "U.S.", "don't", "cat's", "x’s"]
TEXT = st.lists(st.one_of(st.sampled_from(SPECIAL), st.characters(max_codepoint=0x2FFFF,
                                                                  blacklist_categories=("Cs",))),
                max_size=60).map("".join)


def _stream(batch, j: int) -> list[str]:
    return [batch.tokens[i] for i in batch.token_ids[batch.offsets[j]:batch.offsets[j + 1]]]


@pytest.fixture(autouse=True)
def _always_compiled(monkeypatch):
    monkeypatch.setattr(analyzer_mod, "BATCH_MIN_CHARS", 0)


@pytest.mark.parametrize("config", [AnalyzerConfig(), AnalyzerConfig(lowercase=False, stopwords="none",
                                                                      stemmer="none", max_token_length=3)])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=6))
def test_batch_tokens_equal_python(config, texts):
    an = Analyzer(config)
    batch = an.tokenize_batch(texts)
    assert batch.offsets[0] == 0 and len(batch.offsets) == len(texts) + 1
    for j, t in enumerate(texts):
        assert _stream(batch, j) == an.tokenize(t)
    order = list(dict.fromkeys(tok for t in texts for tok in an.tokenize(t)))
    assert batch.tokens == order  # distinct tokens in first-occurrence order


def test_known_streams():
    an = Analyzer()
    texts = ["The cat's U.S.A. 1,000 3.5 don't ﬁne STRASSE", "john's.x a's's", "x😀y 中文"]
    batch = an.tokenize_batch(texts)
    assert _stream(batch, 0) == ["the", "cat", "u.s.a", "1,000", "3.5", "don't", "fine", "strasse"]
    assert _stream(batch, 1) == ["john.x", "a"]
    assert _stream(batch, 2) == ["x", "y", "中", "文"]
    assert an.terms(["the", "running", "x" * 300]) == [None, "run", None]


def _reference_postings(texts: list[str]):
    """Term ids in order of first occurrence, postings sorted by (term, doc)."""
    an = Analyzer()
    vocab: dict[str, int] = {}
    pairs = []
    lens = []
    for d, t in enumerate(texts):
        terms = an.analyze(t)
        lens.append(len(terms))
        for term, tf in Counter(terms).items():
            pairs.append((vocab.setdefault(term, len(vocab)), d, tf))
    pairs.sort()
    return list(vocab), pairs, lens


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.one_of(TEXT, st.sampled_from(["running runs run", "the cat's cats", "U.S. us"])),
                      min_size=1, max_size=30), batch=st.integers(1, 7))
def test_postings_equal_reference(texts, batch):
    pb = PostingsBuilder(Analyzer())
    for i in range(0, len(texts), batch):
        pb.add(texts[i:i + batch])
    out = pb.flush()
    terms, pairs, lens = _reference_postings(texts)
    assert pb.terms == terms
    off = out["offsets"].astype(np.int64)
    got = [(t, int(out["doc_ids"][p]), int(out["tfs"][p])) for t in range(len(terms)) for p in range(off[t], off[t + 1])]
    assert got == pairs
    assert out["doc_len"].tolist() == lens


def test_postings_many_tokens_growing_table():
    """Thousands of distinct tokens over several batches (the token table grows and rehashes)."""
    rng = np.random.default_rng(5)
    words = [f"w{i}x" if i % 3 else f"Run{i}ning" for i in range(6000)]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 50)))) for _ in range(700)]
    texts[100] = "astral 😀 w1x then run4ning"  # Python fallback mid-batch
    pb = PostingsBuilder(Analyzer())
    for i in range(0, len(texts), 256):
        pb.add(texts[i:i + 256])
    out = pb.flush()
    terms, pairs, lens = _reference_postings(texts)
    assert pb.terms == terms and len(terms) > 4000
    off = out["offsets"].astype(np.int64)
    got = [(t, int(out["doc_ids"][p]), int(out["tfs"][p])) for t in range(len(terms)) for p in range(off[t], off[t + 1])]
    assert got == pairs
    assert out["doc_len"].tolist() == lens


def test_csr_by_term_matches_lexsort_and_checks():
    rng = np.random.default_rng(3)
    doc = np.sort(rng.integers(0, 50, 400)).astype(np.uint32)
    tid = rng.integers(0, 30, 400).astype(np.uint32)
    tf = rng.integers(1, 9, 400).astype(np.uint32)
    offsets, d, f = csr_by_term(doc, tid, tf, 32)
    order = np.lexsort((doc, tid))
    assert d.tolist() == doc[order].tolist() and f.tolist() == tf[order].tolist()
    assert offsets.tolist() == [0] + np.cumsum(np.bincount(tid, minlength=32)).tolist()
    with pytest.raises(ValueError, match="out of range"):
        csr_by_term(doc, tid, tf, 10)
    with pytest.raises(ValueError, match="lengths differ"):
        csr_by_term(doc, tid[:-1], tf, 32)


def test_background_thread_equals_inline_over_shards():
    """Batches analysed on the worker thread, shards flushed while later batches queue: the same
    arrays and vocabulary as analysing inline."""
    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(3000)] + ["The", "cat's", "running", "x" * 300, "ﬁne", "中"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 40)))) for _ in range(900)]
    texts[7] = "astral 😀 w1 then running"
    _assert_background_equals_inline(texts, flush_every=300)


def _assert_background_equals_inline(texts: list[str], flush_every: int) -> None:
    """Analyse ``texts`` in batches of 100 (each followed by an empty one), flushing a shard every
    ``flush_every`` texts, inline and on the background workers: identical shards, vocabulary and total length, equal to the
    reference analysis."""
    outs = {}
    for background in (False, True):
        pb = PostingsBuilder(Analyzer(), background=background)
        shards = []
        for i in range(0, len(texts), 100):
            pb.add(texts[i:i + 100])
            pb.add([])  # an empty batch adds nothing
            if i % flush_every == flush_every - 100:
                shards.append(pb.flush_async())
        shards.append(pb.flush_async())
        outs[background] = ([{k: v.tolist() for k, v in f.result().items()} for f in shards], list(pb.terms),
                            pb.sum_dl)
        pb.close()
    assert outs[True] == outs[False]
    terms, _, lens = _reference_postings(texts)
    assert outs[True][1] == terms and outs[True][2] == sum(lens)


def test_background_error_is_raised_later():
    pb = PostingsBuilder(Analyzer(), background=True)
    pb.add(["fine text"])
    pb.add(["ok", 5])  # not a string: fails on the worker thread
    with pytest.raises(AttributeError):
        pb.flush()
    with pytest.raises(RuntimeError, match="failed"):
        pb.add(["more"])
        pb.close()
    pb.close()


def test_two_stage_worker_equals_inline_while_tables_grow():
    """Scan of batch k+1 (growing and reallocating the token table) runs while batch k is resolved
    and counted on the other worker: same postings, vocabulary and lengths as inline, over many
    batches each full of new tokens (long ones too: hashed keys and byte comparisons)."""
    rng = np.random.default_rng(5)
    vocab = [f"tok{i}x{'y' * int(rng.integers(0, 9))}" for i in range(20_000)] + ["the", "dogs'", "running"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(1, 40)))) for _ in range(2_000)]
    _assert_background_equals_inline(texts, flush_every=700)


@pytest.mark.parametrize("background", [False, True])
def test_failed_batch_fails_the_shard_and_later_batches(background):
    """A batch whose scan fails: the error is raised (its own, not a generic one), the shard cannot
    be flushed as if the batch were there, and later batches refuse to run."""
    for _ in range(20 if background else 1):  # the two worker stages race: repeat
        pb = PostingsBuilder(Analyzer(), background=background)
        pb.add(["fine text"] * 50)
        try:
            pb.add(["ok", 5])
        except AttributeError:
            assert not background
        with pytest.raises((AttributeError, RuntimeError)) as exc:
            pb.flush()
        if background:
            assert isinstance(exc.value, AttributeError)
        with pytest.raises(RuntimeError, match="failed"):
            pb.add(["more"])
            pb.close()
        pb.close(raise_errors=False)


def _query_terms_kernel(table, texts, idf, lowercase, threads):
    from retriever.index.analyzer_kernels import _ascii_fold, char_tables
    from retriever import _kernels

    data, off = utf8_arrays(texts)
    return _kernels.bm25_query_terms(data, off, table.slots, table.off, table.blob, table.value, table.n,
                                     *char_tables(analyzer_mod._IDEO), _ascii_fold(analyzer_mod._IDEO, lowercase),
                                     lowercase, idf, n_threads=threads)


@pytest.mark.parametrize("lowercase", [True, False])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=8), seen=st.integers(0, 8), threads=st.sampled_from([1, 2, 3]),
       seed=st.integers(0, 2**16))
def test_query_terms_kernel_equals_python(lowercase, texts, seen, threads, seed):
    """``_kernels.bm25_query_terms`` (C++, read-only token table) against the Python analyzer: a text
    is finished (status 0) exactly when it has no code point above U+FFFF and every token of
    ``Analyzer.tokenize`` is in the table; its terms are then the distinct non-negative table
    values in first-occurrence order, weighted float32(count * idf)."""
    from retriever.index.analyzer_kernels import TokenTable, scan_tokens

    an = Analyzer(AnalyzerConfig(lowercase=lowercase))
    table = TokenTable()
    data, off = utf8_arrays(texts[:seen])
    scan_tokens(data, off, table, lowercase=lowercase, ideo_class=analyzer_mod._IDEO)  # the tokens "seen"
    rng = np.random.default_rng(seed)
    n_terms = 6
    table.set_values(0, rng.integers(-1, n_terms, table.n))
    idf = (rng.random(n_terms) * 4).astype(np.float32)
    entry = {t: i for i, t in enumerate(table.tokens(0, table.n))}
    q_off, q_terms, q_weights, status = _query_terms_kernel(table, texts, idf, lowercase, threads)
    assert q_off[0] == 0 and len(q_off) == len(texts) + 1 and len(q_terms) == q_off[-1]
    for j, text in enumerate(texts):
        toks = an.tokenize(text)
        done = max(map(ord, text), default=0) <= 0xFFFF and all(t in entry for t in toks)
        assert status[j] == (0 if done else 1), (text, toks)
        want = Counter(v for v in (int(table.value[entry[t]]) for t in toks) if v >= 0) if done else Counter()
        assert q_terms[q_off[j]:q_off[j + 1]].tolist() == list(want)
        assert q_weights[q_off[j]:q_off[j + 1]].tolist() == [float(np.float32(c * float(idf[t])))
                                                             for t, c in want.items()]


def test_query_terms_kernel_long_query_and_checks():
    """A query with more distinct terms than the linear dedupe handles (term -> position map), and
    the boundary checks: bad offsets, a value past idf, a corrupted entry."""
    from retriever.index.analyzer_kernels import TokenTable, scan_tokens

    words = [f"word{i}" for i in range(100)] + ["x", "yy"]
    table = TokenTable()
    data, off = utf8_arrays([" ".join(words)])
    scan_tokens(data, off, table, lowercase=True, ideo_class=analyzer_mod._IDEO)
    table.set_values(0, np.arange(table.n) % 90)  # word90..99 share ids with word0..9
    idf = np.linspace(0.5, 3.0, 90, dtype=np.float32)
    text = " ".join(words + words[::-1] + ["WORD5", "x"])
    for threads in (1, 2):
        q_off, q_terms, q_weights, status = _query_terms_kernel(table, [text, "x yy", ""], idf, True, threads)
        assert status.tolist() == [0, 0, 0]
        toks = Analyzer().tokenize(text)
        want = Counter(int(table.value[table.tokens(0, table.n).index(t)]) for t in toks)
        assert q_terms[q_off[0]:q_off[1]].tolist() == list(want)
        assert q_weights[q_off[0]:q_off[1]].tolist() == [float(np.float32(c * float(idf[t]))) for t, c in want.items()]
        assert q_terms[q_off[1]:q_off[2]].tolist() == [100 % 90, 101 % 90] and q_off[3] == q_off[2]
    with pytest.raises(ValueError, match="token table value 89 >= n_terms = 50"):
        _query_terms_kernel(table, ["word89"], idf[:50], True, 1)
    from retriever.index.analyzer_kernels import _ascii_fold, char_tables
    from retriever import _kernels
    tabs = (*char_tables(analyzer_mod._IDEO), _ascii_fold(analyzer_mod._IDEO, True))
    data, off = utf8_arrays(["word1 word2"])
    with pytest.raises(ValueError, match="offsets"):
        _kernels.bm25_query_terms(data, np.array([0, 99], np.int64), table.slots, table.off, table.blob, table.value,
                                  table.n, *tabs, True, idf)
    with pytest.raises(ValueError, match="n_entries"):
        _kernels.bm25_query_terms(data, off, table.slots, table.off, table.blob, table.value, len(table.value) + 1,
                                  *tabs, True, idf)
    bad = table.slots.copy()
    bad[1::2][bad[0::2] != 0] = 10**9  # every entry out of range
    with pytest.raises(ValueError, match="outside"):
        _kernels.bm25_query_terms(data, off, bad, table.off, table.blob, table.value, table.n, *tabs, True, idf)


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=12), seen=st.integers(0, 12), threads=st.sampled_from([1, 2, 3]),
       seed=st.integers(0, 2**16), k=st.sampled_from([1, 3, 50]), use_impacts=st.booleans())
def test_topk_text_kernel_equals_two_calls(texts, seen, threads, seed, k, use_impacts):
    """``_kernels.bm25_topk_text`` (analysis and exhaustive scoring in one pass) equals
    ``bm25_query_terms`` followed by ``bm25_topk(algorithm="exhaustive")``: ids, scores, n_found bit
    for bit, and the same status (a query left to the caller has an empty row)."""
    from retriever.index.analyzer_kernels import TokenTable, _ascii_fold, char_tables, scan_tokens
    from retriever import _kernels

    table = TokenTable()
    data, off = utf8_arrays(texts[:seen])
    scan_tokens(data, off, table, lowercase=True, ideo_class=analyzer_mod._IDEO)
    rng = np.random.default_rng(seed)
    n_terms, n_docs = 6, 40
    table.set_values(0, rng.integers(-1, n_terms, table.n))
    idf = (rng.random(n_terms) * 4).astype(np.float32)
    lens = rng.integers(0, n_docs, n_terms)
    offsets = np.zeros(n_terms + 1, np.uint64)
    np.cumsum(lens, out=offsets[1:])
    doc_ids = np.concatenate([np.sort(rng.choice(n_docs, n, replace=False)) for n in lens]).astype(np.uint32)
    tfs = rng.integers(1, 5, len(doc_ids)).astype(np.uint32)
    norm = (rng.random(n_docs) * 2 + 0.2).astype(np.float32)
    kw = {}
    if use_impacts:
        kw["impacts"] = _kernels.bm25_impacts(offsets, doc_ids, tfs, norm)
        slot, rows = _kernels.bm25_impact_rows(offsets, doc_ids, kw["impacts"], n_docs, min_df=n_docs // 4,
                                               max_rows=2)
        if len(rows):
            kw.update(impact_rows=rows, impact_row_slot=slot)
    tabs = (*char_tables(analyzer_mod._IDEO), _ascii_fold(analyzer_mod._IDEO, True), True)
    data, off = utf8_arrays(texts)
    targs = (data, off, table.slots, table.off, table.blob, table.value, table.n, *tabs, idf)
    q_off, q_terms, q_weights, status = _kernels.bm25_query_terms(*targs, n_threads=threads)
    want = _kernels.bm25_topk(offsets, doc_ids, tfs, norm, q_off, q_terms, q_weights, k, n_threads=threads,
                              algorithm="exhaustive", **kw)
    *got, got_status = _kernels.bm25_topk_text(*targs, offsets, doc_ids, tfs, norm, k, n_threads=threads, **kw)
    np.testing.assert_array_equal(got_status, status)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_topk_text_kernel_checks():
    """bm25_topk_text's boundary checks name the argument: text offsets, k, a term id past the
    postings' vocabulary, a non-finite weight from idf, impact rows without impacts."""
    from retriever.index.analyzer_kernels import TokenTable, _ascii_fold, char_tables, scan_tokens
    from retriever import _kernels

    table = TokenTable()
    data, off = utf8_arrays(["alpha beta gamma"])
    scan_tokens(data, off, table, lowercase=True, ideo_class=analyzer_mod._IDEO)
    table.set_values(0, np.arange(table.n))
    tabs = (*char_tables(analyzer_mod._IDEO), _ascii_fold(analyzer_mod._IDEO, True), True)
    idf = np.ones(3, np.float32)
    post = (np.array([0, 1, 2, 3], np.uint64), np.array([0, 1, 0], np.uint32), np.ones(3, np.uint32),
            np.ones(2, np.float32))
    tab = (table.slots, table.off, table.blob, table.value, table.n, *tabs)
    ids, scores, n_found, status = _kernels.bm25_topk_text(data, off, *tab, idf, *post, 2)
    assert status.tolist() == [0] and n_found.tolist() == [2] and ids[0].tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"^text offsets\[1\] = 99 is below offsets\[0\] or past the data"):
        _kernels.bm25_topk_text(data, np.array([0, 99], np.int64), *tab, idf, *post, 2)
    with pytest.raises(ValueError, match="k must be"):
        _kernels.bm25_topk_text(data, off, *tab, idf, *post, 0)
    short = (np.array([0, 1, 2], np.uint64), np.array([0, 1], np.uint32), np.ones(2, np.uint32), post[3])
    with pytest.raises(ValueError, match=r"token table value 2 \(a query token's term id\) >= n_terms = 2 of the postings"):
        _kernels.bm25_topk_text(data, off, *tab, idf, *short, 2)
    with pytest.raises(ValueError, match=r"idf\[1\] = inf gives query weight inf, not finite"):
        _kernels.bm25_topk_text(data, off, *tab, np.array([1, np.inf, 1], np.float32), *post, 2)
    with pytest.raises(ValueError, match=r"^offsets\[-1\] = 9 must equal len\(doc_ids\) = 3"):
        _kernels.bm25_topk_text(data, off, *tab, idf, np.array([0, 1, 2, 9], np.uint64), *post[1:], 2)
    with pytest.raises(ValueError, match=r"^offsets\[1:3\] = \[3, 1\] is not a range inside doc_ids"):
        _kernels.bm25_topk_text(data, off, *tab, idf, np.array([0, 3, 1, 3], np.uint64), *post[1:], 2)
    with pytest.raises(ValueError, match="impact_rows and impact_row_slot go together"):
        _kernels.bm25_topk_text(data, off, *tab, idf, *post, 2, impact_rows=np.zeros(2, np.float32),
                                impact_row_slot=np.full(3, -1, np.int32))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(terms=st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12),
                      unique=True, max_size=300),
       before=st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=9),
                       unique=True, max_size=20),
       dup=st.integers(-1, 400))
def test_add_distinct_equals_verbatim_scan(terms, before, dup):
    """``TokenTable.add_distinct`` (the living index's vocabulary seed: slots filled in home-slot
    order) builds the table ``scan_tokens(verbatim=True)`` builds: the same entries in the same
    order, and every term found at its entry by a later scan (short keys of <= 7 bytes and long
    hashed ones, the empty term, multi-byte UTF-8, entries already in the table); a repeated term,
    of the batch or of the table, is a ValueError naming its index."""
    from retriever.index.analyzer_kernels import TokenTable, scan_tokens

    terms = [t for t in terms if t not in before]
    if 0 <= dup < len(before) + len(terms) and (before or terms):
        src = (before + terms)[dup % (len(before) + len(terms))]
        pos = dup % (len(terms) + 1)
        bad = terms[:pos] + [src] + terms[pos:]
        table = TokenTable()
        if before:
            table.add_distinct(*utf8_arrays(before))
        later = pos if src in before or src in terms[:pos] else terms.index(src) + 1  # the second copy
        with pytest.raises(ValueError, match=f"^text {later} "):
            table.add_distinct(*utf8_arrays(bad))
        return
    fast, ref = TokenTable(), TokenTable()
    for table, add in ((fast, lambda t, d, o: t.add_distinct(d, o)),
                       (ref, lambda t, d, o: scan_tokens(d, o, t, lowercase=False, ideo_class=analyzer_mod._IDEO,
                                                         verbatim=True))):
        for part in (before, terms):
            if part:
                add(table, *utf8_arrays(part))
    assert fast.n == ref.n == len(before) + len(terms)
    assert fast.tokens(0, fast.n) == ref.tokens(0, ref.n) == before + terms
    np.testing.assert_array_equal(fast.off[:fast.n + 1], ref.off[:ref.n + 1])
    probe = (before + terms)[::-1] + ["never-seen-term", "q"]
    data, off = utf8_arrays(probe)
    n0 = fast.n
    _done, entries, _counts, _first = scan_tokens(data, off, fast, lowercase=False, ideo_class=analyzer_mod._IDEO,
                                                  verbatim=True)
    want = list(range(n0))[::-1]
    assert entries.tolist()[:n0] == want
    assert fast.n == n0 + len({"never-seen-term", "q"} - set(before + terms))
