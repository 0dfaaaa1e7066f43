"""Adapters to RAG frameworks: thin layers over :class:`retriever.Retriever`.

- :mod:`retriever.integrations.langchain` (extra ``retriever[langchain]``): ``LangChainRetriever``.
- :mod:`retriever.integrations.llamaindex` (extra ``retriever[llamaindex]``): ``LlamaIndexRetriever``.

Importing :mod:`retriever` or this package imports neither framework; each adapter module imports
its own framework and fails with an ``ImportError`` naming the extra when it is missing.
"""
