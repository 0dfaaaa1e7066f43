"""Tests of the LangChain and LlamaIndex adapters (a package, so that its conftest does not shadow
tests/conftest.py under pytest's default import mode)."""
