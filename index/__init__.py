"""Indexing pipeline: corpus readers, analyzer, encoders, on-disk format and the writer.

Data flows one way: ``index`` never imports ``retriever``.
"""

if __name__ != "retriever.index":  # e.g. ``import index`` with the repository root on sys.path
    raise ImportError(f"the indexing package is 'retriever.index', not {__name__!r}: importing it under a "
                      "second name would load a second copy of every module and exception class "
                      "(an IndexFormatError of one copy is not caught as the other's); import retriever.index")
