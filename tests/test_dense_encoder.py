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
    from retriever.index.encoders.dense import DenseEncoder
    from retriever.index.errors import ModelError

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
    from retriever.index.errors import ModelError
    from retriever import build_index

    docs = [{"_id": str(i), "text": t} for i, t in enumerate(TEXTS)]
    try:
        m = build_index(docs, tmp_path / "ix", legs=("bm25", "dense"), show_progress=False)
    except ModelError as e:
        pytest.skip(f"bundled dense model not installed: {e}")
    st = m["build"]
    assert 0 <= st["model_load_seconds"] <= st["build_seconds"]
    assert set(st["encode_seconds"]) == {"dense"} and 0 < st["encode_seconds"]["dense"] <= st["build_seconds"]
    m2 = build_index(docs, tmp_path / "ix2", legs=("bm25",), show_progress=False)
    assert "model_load_seconds" not in m2["build"] and "encode_seconds" not in m2["build"]


def test_bfloat16_precision_close_to_float32(enc):
    """precision="bfloat16" runs the forward pass under autocast: float32 unit vectors in input
    order, close to the float32 ones (same model, texts, batching); an unknown precision is refused."""
    from retriever.index.encoders.dense import DenseEncoder
    from retriever.index.errors import ModelError

    bf = DenseEncoder(None, max_length=16, batch_size=3, precision="bfloat16")
    a, b = enc.encode(TEXTS), bf.encode(TEXTS)
    assert b.dtype == np.float32 and b.shape == a.shape
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cos = (a * b).sum(1)
    assert cos.min() > 0.99 and not np.array_equal(a, b)  # bf16 arithmetic really ran
    with pytest.raises(ModelError, match="precision"):
        DenseEncoder(None, precision="float16")


def test_dense_precision_config_and_manifest(tmp_path):
    from retriever.index.config import BuildConfig, DenseConfig
    from retriever.index.errors import ConfigError, ModelError
    from retriever import Retriever, build_index

    with pytest.raises(ConfigError, match="dense precision"):
        DenseConfig(precision="fp8")
    cfg = BuildConfig(legs=("bm25", "dense"), dense=DenseConfig(precision="bfloat16"))
    assert BuildConfig.from_dict(cfg.to_dict()) == cfg
    docs = [{"_id": str(i), "text": t} for i, t in enumerate(TEXTS)]
    try:
        build_index(docs, tmp_path / "ix", config=cfg, show_progress=False)
    except ModelError as e:
        pytest.skip(f"bundled dense model not installed: {e}")
    r = Retriever.open(tmp_path / "ix")
    assert r.reader.config.dense.precision == "bfloat16"  # recorded in the manifest
    hits = r.search(TEXTS[2], k=1, mode="dense")
    assert hits[0].id == "2"  # a document is its own nearest neighbour
