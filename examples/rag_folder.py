"""Worked example: index a folder of text files, ask a question, print the retrieved context
through LangChain and through LlamaIndex. Runs offline (the index's bundled models; no LLM).

    python examples/rag_folder.py FOLDER INDEX_DIR "your question"
"""

from __future__ import annotations

import sys
from pathlib import Path

from retriever import Retriever, build_index
from retriever.integrations.langchain import LangChainRetriever
from retriever.integrations.llamaindex import LlamaIndexRetriever


def build(folder: Path, index_dir: Path) -> None:
    """One record per ``*.txt`` file: its stem as ``_id`` and title, its name as metadata."""
    records = [{"_id": p.stem, "title": p.stem.replace("_", " "), "text": p.read_text(encoding="utf-8"),
                "source": p.name} for p in sorted(folder.glob("*.txt"))]
    build_index(records, index_dir, legs=("bm25", "dense"), overwrite=True, show_progress=False)


def main(folder: str, index_dir: str, question: str) -> None:
    build(Path(folder), Path(index_dir))
    with Retriever.open(index_dir) as r:
        docs = LangChainRetriever(retriever=r, k=2).invoke(question)   # hybrid: BM25 + dense, RRF
        print("LangChain context:")
        for d in docs:
            s = d.metadata["retriever"]
            print(f"  {d.id} score={s['score']:.4f} legs={ {k: v['rank'] for k, v in s['legs'].items()} }")
        # an LLM goes here, e.g. with langchain: (prompt | llm).invoke({"context": docs, "question": question})
        nodes = LlamaIndexRetriever(r, similarity_top_k=2).retrieve(question)
        print("LlamaIndex context:")
        for n in nodes:
            print(f"  {n.node.node_id} score={n.score:.4f} source={n.node.metadata['source']}")
        # an LLM goes here, e.g. RetrieverQueryEngine.from_args(retriever, llm=...).query(question)


if __name__ == "__main__":
    main(*sys.argv[1:4])
