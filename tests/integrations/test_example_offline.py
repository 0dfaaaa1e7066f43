"""The README's worked example (examples/rag_folder.py) and a LlamaIndex VectorStoreIndex with its
default text splitter run with every network connection refused: nothing downloads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

REPO = Path(__file__).resolve().parents[2]

#: run a script with sockets refused (a download attempt fails loudly instead of succeeding)
NO_NET = """
import runpy, socket, sys
class Refused(OSError):
    pass
def refuse(*a, **k):
    raise Refused("network access attempted: " + repr(a[:2]))
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

FILES = {"vitamin_d.txt": "Vitamin D deficiency raises the risk of bone fractures in older adults.",
         "sleep.txt": "Short sleep impairs memory consolidation and attention.",
         "insulin.txt": "Insulin resistance precedes type 2 diabetes by years.",
         "statins.txt": "Statins lower LDL cholesterol and cardiovascular events."}


def _run(tmp_path: Path, script: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "NLTK_DATA")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), **env_vars)
    return subprocess.run([sys.executable, "-c", NO_NET, str(script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def test_worked_example_runs_offline(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    res = _run(tmp_path, REPO / "examples" / "rag_folder.py", str(folder), str(tmp_path / "idx"),
               "does vitamin D prevent fractures?")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0] == "LangChain context:" and out[1].startswith("  vitamin_d score=")
    assert "'bm25': 1" in out[1] and "'dense': 1" in out[1]
    i = out.index("LlamaIndex context:")
    assert out[i + 1].startswith("  vitamin_d score=") and out[i + 1].endswith("source=vitamin_d.txt")
    assert len(out) == 6


def test_llamaindex_default_splitter_runs_offline(tmp_path):
    """VectorStoreIndex.from_documents with LlamaIndex's default SentenceSplitter (a tiktoken
    tokenizer and NLTK's sentence splitter) reads the tiktoken and NLTK files llama-index-core ships
    (its _static caches) and downloads nothing."""
    script = tmp_path / "li.py"
    script.write_text(f"""
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from retriever.integrations.llamaindex import LlamaIndexVectorStore
store = LlamaIndexVectorStore({str(tmp_path / 'vs')!r})
docs = [Document(text=(t + " ") * 200, id_=n) for n, t in {FILES!r}.items()]
idx = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                      embed_model=MockEmbedding(embed_dim=8))
nodes = idx.as_retriever(vector_store_query_mode="sparse", similarity_top_k=1).retrieve("statins cholesterol")
print(nodes[0].node.ref_doc_id, len(store.client.live_ids()) > len(docs))
""")
    res = _run(tmp_path, script)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["statins.txt", "True"]


def test_the_guard_refuses_network(tmp_path):
    script = tmp_path / "net.py"
    script.write_text("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=5)\n")
    res = _run(tmp_path, script)
    assert res.returncode != 0 and "network access attempted" in res.stderr


def test_plain_tokenizer_splitter_needs_no_cache_files(tmp_path):
    """With TIKTOKEN_CACHE_DIR and NLTK_DATA pointing at empty folders (LlamaIndex would download
    into them), a TokenTextSplitter with a plain tokenizer still runs offline."""
    script = tmp_path / "li.py"
    script.write_text(f"""
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.node_parser import TokenTextSplitter
from retriever.integrations.llamaindex import LlamaIndexVectorStore
store = LlamaIndexVectorStore({str(tmp_path / 'vs')!r})
docs = [Document(text=(t + " ") * 200, id_=n) for n, t in {FILES!r}.items()]
idx = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                      embed_model=MockEmbedding(embed_dim=8),
                                      transformations=[TokenTextSplitter(chunk_size=256, tokenizer=str.split)])
nodes = idx.as_retriever(vector_store_query_mode="sparse", similarity_top_k=1).retrieve("insulin diabetes")
print(nodes[0].node.ref_doc_id, len(store.client.live_ids()) > len(docs))
""")
    (tmp_path / "tk").mkdir()
    (tmp_path / "nl").mkdir()
    res = _run(tmp_path, script, TIKTOKEN_CACHE_DIR=str(tmp_path / "tk"), NLTK_DATA=str(tmp_path / "nl"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["insulin.txt", "True"]
    assert not any((tmp_path / "tk").iterdir()) and not any((tmp_path / "nl").iterdir())
