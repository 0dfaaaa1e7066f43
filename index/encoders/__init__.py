"""Encoders that turn text into vectors (dense, learned sparse)."""
