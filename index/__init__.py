"""Indexing pipeline: corpus readers, analyzer, encoders, on-disk format and the writer.

Data flows one way: ``index`` never imports ``retriever``.
"""
