"""Data of the framework adapter tests: a seeded corpus with typed metadata and a few queries."""

from __future__ import annotations

import random

WORDS = ("vitamin fracture bone risk protein gene cell cancer therapy dose trial patient blood "
         "pressure heart muscle brain memory sleep diet sugar insulin liver kidney virus immune").split()
LANGS = ("en", "de", "fr")


def rag_corpus(n: int = 200, seed: int = 3) -> list[dict]:
    """Seeded synthetic records with typed metadata: ``lang`` (str), ``year`` (int), ``source`` (str,
    on every second record only)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        rec = {"_id": f"doc{i}", "title": rng.choice(WORDS) if i % 4 else "",
               "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))),
               "lang": LANGS[i % 3], "year": 2000 + i % 25}
        if i % 2:
            rec["source"] = f"s{i % 5}"
        docs.append(rec)
    return docs


QUERIES = ["vitamin bone fracture", "heart blood pressure trial", "insulin sugar diet", "memory sleep brain"]
