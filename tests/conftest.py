"""Shared fixtures: data location, small corpora and session-scoped indexes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RETRIEVER_DATA", ROOT.parent / "shared" / "data"))

WORDS = ("vitamin fracture bone risk protein gene cell cancer therapy dose trial patient blood "
         "pressure heart muscle brain memory sleep diet sugar insulin liver kidney virus immune").split()


def random_corpus(n: int, seed: int = 0, *, min_len: int = 0, max_len: int = 40) -> list[dict]:
    """Seeded synthetic corpus over a small vocabulary (many repeated terms and ties)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        length = rng.randint(min_len, max_len)
        words = [rng.choice(WORDS) for _ in range(length)]
        docs.append({"_id": f"d{i}", "title": rng.choice(WORDS) if i % 3 else "", "text": " ".join(words),
                     "meta": i})
    return docs


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "medline" / "corpus.jsonl.gz").is_file():
        pytest.skip(f"test collections not found at {DATA} (set RETRIEVER_DATA)")
    return DATA


@pytest.fixture(scope="session")
def small_corpus() -> list[dict]:
    return random_corpus(300, seed=1)


@pytest.fixture(scope="session")
def bm25_index(tmp_path_factory, small_corpus) -> Path:
    from retriever import build_index

    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(small_corpus, out, legs=("bm25",), show_progress=False)
    return out


@pytest.fixture(scope="session")
def medline_index(tmp_path_factory, data_dir) -> Path:
    """BM25 + dense index of the MED collection (1,033 docs), built once per session via the CLI."""
    from retriever.cli import main

    out = tmp_path_factory.mktemp("idx") / "medline"
    rc = main(["index", "build", "--corpus", str(data_dir / "medline"), "--out", str(out), "--no-progress",
               "--shard-size", "400"])
    assert rc == 0
    return out


def cli_error(capsys, argv) -> str:
    """Run the CLI with ``argv``; assert it failed with exit code 1 and a one-line ``error: ...``
    message (no traceback) on stderr, and return that message."""
    from retriever.cli import main
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 1, (rc, cap.err)
    assert cap.err.startswith("error: ") and "Traceback" not in cap.err
    assert len(cap.err.strip().splitlines()) == 1, cap.err
    return cap.err
