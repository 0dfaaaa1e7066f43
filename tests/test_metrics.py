"""retriever.metrics: the one recall@k rule and the one latency summary."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.index.errors import QueryError
from retriever.metrics import latency_summary, recall_at_k


def test_recall_at_k_rule():
    """|found ∩ ref| / |ref| per query over the first k, -1 ignored, empty references left out."""
    exact = np.array([[1, 2, 3], [4, 5, -1], [-1, -1, -1]])
    got = np.array([[3, 2, 9], [4, 5, -1], [7, 8, 9]])
    # query 0: 2 of 3; query 1: short reference (2 ids), both found; query 2: no reference, left out
    assert recall_at_k(got, exact, 3) == pytest.approx((2 / 3 + 1.0) / 2)
    assert recall_at_k(exact, exact, 2) == 1.0
    # only the first k of each list count: 3 is outside found[:1], 1 is outside ref[:1] of row 0
    assert recall_at_k(np.array([[3, 1]]), np.array([[1, 3]]), 1) == 0.0
    assert recall_at_k(np.array([[1, 3]]), np.array([[1, 3]]), 1) == 1.0
    # every reference empty (and no query at all): nothing to recall
    assert recall_at_k(got[2:], exact[2:], 3) is None
    assert recall_at_k(np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64), 3) is None


def test_recall_at_k_ragged_rows_equal_padded_arrays():
    found = [[5, 6], [1], []]
    ref = [[5, 7, 8], [1, 2], [3]]
    padded_f = np.array([[5, 6, -1], [1, -1, -1], [-1, -1, -1]])
    padded_r = np.array([[5, 7, 8], [1, 2, -1], [3, -1, -1]])
    want = (1 / 3 + 1 / 2 + 0.0) / 3
    assert recall_at_k(found, ref, 3) == pytest.approx(want)
    assert recall_at_k(padded_f, padded_r, 3) == pytest.approx(want)


@pytest.mark.parametrize("args, match", [
    ((np.zeros((2, 3), np.int64), np.zeros((3, 3), np.int64), 3), "2 rows, reference has 3"),
    ((np.zeros(3, np.int64), np.zeros((1, 3), np.int64), 3), "found must be a 2-D"),
    ((np.zeros((1, 3), np.int64), np.zeros((1, 3), np.int64), 0), "k must be an integer >= 1"),
    ((np.zeros((1, 3), np.int64), np.zeros((1, 3), np.int64), True), "k must be an integer >= 1"),
    (([[0.5]], [[1]], 1), "row 0 holds float64"),
])
def test_recall_at_k_errors(args, match):
    with pytest.raises(QueryError, match=match):
        recall_at_k(*args)


def test_latency_summary():
    # linear interpolation on the sorted samples 1, 2, 3, 4, 10: p95 at position 3.8 = 4 + 0.8 * 6
    s = latency_summary([4.0, 1.0, 3.0, 2.0, 10.0])
    assert s == {"p50": 3.0, "p95": pytest.approx(8.8), "p99": pytest.approx(9.76), "mean": 4.0, "max": 10.0}
    assert list(latency_summary([1.0, 2.0], (50, 90))) == ["p50", "p90", "mean", "max"]
    empty = latency_summary([])
    assert set(empty) == {"p50", "p95", "p99", "mean", "max"} and all(np.isnan(v) for v in empty.values())
    with pytest.raises(QueryError, match="percentiles must lie in"):
        latency_summary([1.0], (50, 101))
