"""The living index's id map (``retriever.index.id_map.IdMap``) against a Python dict model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retriever.index.id_map import IdMap

_IDS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)  # "\n", "", astral, 7 / 8 bytes


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(_IDS, unique=True, max_size=40),
       ops=st.lists(st.tuples(st.sampled_from(["assign", "remove", "find"]), st.lists(_IDS, unique=True, max_size=12)),
                    max_size=25),
       arrow=st.booleans())
def test_id_map_equals_a_dict(first, ops, arrow):
    """Random load / assign / remove / find sequences give what a dict gives: the codes, -1 for
    ids without a live row, the live count (ids deleted and added again included)."""
    m, model = IdMap(), {}
    codes = np.arange(len(first), dtype=np.int64) * 3
    m.load(pa.array(first, pa.string()) if arrow else first, codes)
    model.update(zip(first, codes.tolist()))
    nxt = 10_000
    for op, ids in ops:
        if op == "assign":
            new = np.arange(nxt, nxt + len(ids), dtype=np.int64)
            nxt += len(ids)
            m.assign(ids, new)
            model.update(zip(ids, new.tolist()))
        elif op == "remove":
            got = m.remove(ids)
            assert got.tolist() == [model.pop(i, -1) for i in ids]
        else:
            assert m.find(ids).tolist() == [model.get(i, -1) for i in ids]
        assert len(m) == len(model)
    every = first + [i for _, ids in ops for i in ids]
    assert m.find(every).tolist() == [model.get(i, -1) for i in every]


def test_id_map_edges():
    """A repeated id in a load names it; a lone surrogate (no stored id can hold one) is never
    found; sliced Arrow arrays; a map of 200,000 ids (the table grows)."""
    m = IdMap()
    with pytest.raises(ValueError, match="'b'"):
        m.load(["a", "b", "b"], np.arange(3))
    m = IdMap()
    m.load(["x\ud800"[:1], "é", ""], np.arange(3))
    assert m.find(["x\ud800", "x", "é", ""]).tolist() == [-1, 0, 1, 2]
    assert m.remove(["\udfff", "x"]).tolist() == [-1, 0]
    arr = pa.array([f"id{i}" for i in range(10)], pa.large_string()).slice(3, 4)
    m.load(arr, np.arange(100, 104))
    assert m.find(["id3", "id6", "id7", "id2"]).tolist() == [100, 103, -1, -1]
    big = [f"doc-{i:07d}" for i in range(200_000)]
    m2 = IdMap()
    m2.load(pa.array(big), np.arange(200_000))
    probe = big[::997] + ["doc-x"]
    assert m2.find(probe).tolist() == list(range(0, 200_000, 997)) + [-1]
    m2.assign(["doc-x", big[5]], np.array([7, 8]))
    assert m2.find(["doc-x", big[5]]).tolist() == [7, 8] and len(m2) == 200_001
    with pytest.raises(ValueError, match=">= 0"):
        m2.assign(["q"], np.array([-1]))
