"""Retrieval legs: each turns a batch of queries into per-leg top-depth candidate arrays."""
