"""Dense encoder: truncation count from the fast tokenizer's overflow (one tokenisation) against a
brute-force count; batched, length-sorted vectors against one text at a time; build_index stats
split model loading and encoding time."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def enc():
    from index.encoders.dense import DenseEncoder
    from index.errors import ModelError

    try:
        return DenseEncoder(None, max_length=16, batch_size=3)
    except ModelError as e:
        pytest.skip(f"bundled dense model not installed: {e}")


TEXTS = ["short", "a b c d e f g h i j k l m n", "one two three four five six seven eight nine ten "
         "eleven twelve thirteen fourteen fifteen", "", "x " * 13, "x " * 14, "x " * 15,
         "tokenisation of unbelievably overcomplicated hyphenated-words goes on and on"]


def test_truncation_count_matches_bruteforce(enc):
    full = enc.tokenizer(TEXTS, truncation=False, padding=False)["input_ids"]
    expected = sum(len(ids) > enc.max_length for ids in full)
    assert 0 < expected < len(TEXTS)
    before = enc.n_truncated
    enc.encode(TEXTS)
    assert enc.n_truncated - before == expected
    assert enc._count_truncated(list(TEXTS)) == expected  # the slow-tokenizer fallback agrees


def test_batched_equals_one_at_a_time(enc):
    batched = enc.encode(TEXTS)
    single = np.stack([enc.encode([t])[0] for t in TEXTS])
    assert batched.shape == (len(TEXTS), enc.dim) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, single, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_build_stats_split_model_time(tmp_path):
    from index.errors import ModelError
    from retriever import build_index

    docs = [{"_id": str(i), "text": t} for i, t in enumerate(TEXTS)]
    try:
        m = build_index(docs, tmp_path / "ix", legs=("bm25", "dense"), show_progress=False)
    except ModelError as e:
        pytest.skip(f"bundled dense model not installed: {e}")
    st = m["stats"]
    assert 0 <= st["model_load_seconds"] <= st["build_seconds"]
    assert set(st["encode_seconds"]) == {"dense"} and 0 < st["encode_seconds"]["dense"] <= st["build_seconds"]
    m2 = build_index(docs, tmp_path / "ix2", legs=("bm25",), show_progress=False)
    assert "model_load_seconds" not in m2["stats"] and "encode_seconds" not in m2["stats"]
