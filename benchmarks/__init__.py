"""Benchmarks: each script measures this engine against its peers in the same run."""
