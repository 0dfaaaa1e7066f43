"""Regression pins: build each pinned index, evaluate it against qrels, print OK / FAIL per metric.

In the style of Pyserini's two-click reproductions (2CR): ``expected.yaml`` beside this file lists,
per pin, the collection, the index legs, the search settings, the command that reproduces the
figure by hand, and metric → expected value; every measured value must lie within the tolerance
of the expected one. Measurement goes through the library exactly as ``retriever eval`` does
(:func:`retriever.evaluation.evaluate_index`: ``search_arrays`` then ir-measures / pytrec_eval),
unrounded.

Usage (from the repository root)::

    python -m tests.regression.run            # the fast pins (BM25 on every collection)
    python -m tests.regression.run --slow     # also the pins marked slow (dense encoding, hybrid)
    python -m tests.regression.run --only scifact --index-dir DIR   # keep/reuse the built indexes

Exit status: 0 every checked metric OK, 1 at least one FAIL, 2 a bad pin file or missing data.
Collections are read from ``$RETRIEVER_DATA`` (default: ``../shared/data`` beside the repository).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("expected.yaml")
#: metric names a pin may use (the keys of :data:`retriever.evaluation.DEFAULT_METRICS`)
METRICS = ("ndcg@10", "recall@100", "mrr@10")
PIN_KEYS = {"name", "collection", "legs", "mode", "slow", "command", "metrics", "tolerance", "fusion", "depth",
            "k", "leg_params", "reference"}


class PinFileError(ValueError):
    """A pin file that cannot be used (the message names the file, the pin and the field)."""


@dataclass(frozen=True)
class Pin:
    """One pinned run: an index of ``collection`` with ``legs``, searched in ``mode``, and the
    expected value of each metric (absolute tolerance ``tolerance``)."""

    name: str
    collection: str
    legs: tuple[str, ...]
    mode: str
    metrics: Mapping[str, float]
    tolerance: float
    slow: bool = False
    command: str = ""
    fusion: str | None = None
    depth: int | None = None
    k: int = 100
    leg_params: Mapping[str, Mapping[str, Any]] | None = None
    reference: str = ""


@dataclass
class Line:
    """One checked (or skipped) metric of a pin."""

    pin: str
    metric: str
    expected: float
    measured: float | None
    tolerance: float
    status: str  # "OK", "FAIL" or "SKIP"
    note: str = ""

    def format(self) -> str:
        """``STATUS  pin  metric  expected X  measured Y  |diff| D (tol T)`` as one line."""
        head = f"{self.status:<4}  {self.pin:<22} {self.metric:<10} expected {self.expected:.6f}"
        if self.measured is None:
            return f"{head}  {self.note}"
        diff = abs(self.measured - self.expected)
        return f"{head}  measured {self.measured:.6f}  |diff| {diff:.1e} (tol {self.tolerance:.0e})"


@dataclass
class Report:
    """Every line of one run and the seconds each index build / evaluation took."""

    lines: list[Line] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no line failed."""
        return not any(line.status == "FAIL" for line in self.lines)


def _need(cond: bool, path: Path, where: str, msg: str) -> None:
    if not cond:
        raise PinFileError(f"{path}: {where}: {msg}")


def load_pins(path: str | Path = EXPECTED) -> list[Pin]:
    """Read and check a pin file (YAML: ``tolerance`` default and a ``pins`` list).

    Raises:
        PinFileError: unreadable YAML, an unknown or missing field, a metric that is not one of
            :data:`METRICS`, a value that is not a number in [0, 1], a duplicate pin name (the
            message names the file, the pin and the field).
    """
    import yaml

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise PinFileError(f"{path}: cannot read the pin file ({e})") from None
    _need(isinstance(doc, dict) and isinstance(doc.get("pins"), list), path, "top level",
          "expected a mapping with a 'pins' list")
    default_tol = doc.get("tolerance", 5e-5)
    _need(isinstance(default_tol, (int, float)) and default_tol >= 0, path, "tolerance",
          f"expected a number >= 0, got {default_tol!r}")
    pins: list[Pin] = []
    for i, raw in enumerate(doc["pins"]):
        where = f"pin {i}"
        _need(isinstance(raw, dict), path, where, f"expected a mapping, got {raw!r}")
        where = f"pin {raw.get('name', i)!r}"
        unknown = sorted(set(raw) - PIN_KEYS)
        _need(not unknown, path, where, f"unknown field(s) {unknown}; valid: {sorted(PIN_KEYS)}")
        for key in ("name", "collection", "legs", "mode", "metrics"):
            _need(key in raw, path, where, f"missing field {key!r}")
        legs = raw["legs"]
        _need(isinstance(legs, list) and legs and all(isinstance(x, str) for x in legs), path, f"{where} legs",
              f"expected a list of leg names, got {legs!r}")
        metrics = raw["metrics"]
        _need(isinstance(metrics, dict) and metrics, path, f"{where} metrics", "expected metric: value pairs")
        for m, v in metrics.items():
            _need(m in METRICS, path, f"{where} metrics", f"unknown metric {m!r}; valid: {', '.join(METRICS)}")
            _need(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, path,
                  f"{where} metrics {m}", f"expected a number in [0, 1], got {v!r}")
        tol = raw.get("tolerance", default_tol)
        _need(isinstance(tol, (int, float)) and tol >= 0, path, f"{where} tolerance", f"expected a number >= 0, got {tol!r}")
        _need(raw["name"] not in {p.name for p in pins}, path, where, "duplicate pin name")
        pins.append(Pin(name=str(raw["name"]), collection=str(raw["collection"]), legs=tuple(legs),
                        mode=str(raw["mode"]), metrics={m: float(v) for m, v in metrics.items()},
                        tolerance=float(tol), slow=bool(raw.get("slow", False)), command=str(raw.get("command", "")),
                        fusion=raw.get("fusion"), depth=raw.get("depth"), k=int(raw.get("k", 100)),
                        leg_params=raw.get("leg_params"), reference=str(raw.get("reference", ""))))
    return pins


def data_root() -> Path:
    """``$RETRIEVER_DATA``, else ``../shared/data`` beside the repository."""
    return Path(os.environ.get("RETRIEVER_DATA", ROOT.parent / "shared" / "data"))


def check(pins: Sequence[Pin], *, slow: bool = False, data: Path | None = None, index_dir: Path | None = None,
          echo: Callable[[str], None] | None = print) -> Report:
    """Build the indexes the pins need (one per collection and legs), evaluate every pin and
    compare; pins marked slow are skipped unless ``slow``.

    Args:
        pins: from :func:`load_pins`.
        slow: also run the pins marked slow.
        data: folder of BEIR collections (default :func:`data_root`).
        index_dir: where indexes are built and kept (an index already there is reused as it is,
            so clear the folder after a change to the build side); default a temporary folder
            removed afterwards.
        echo: called with each formatted line as soon as it is known (``None``: quiet).

    Returns:
        a :class:`Report` (one line per pin and metric).

    Raises:
        PinFileError: a collection folder that is missing under ``data``.
        RetrieverError: a pin's legs, mode, fusion, depth or leg_params refused by the library.
    """
    from retriever import Retriever, build_index
    from retriever.evaluation import evaluate_index
    from retriever.index.readers import read_qrels, read_queries

    data = data or data_root()
    report = Report()
    say = echo or (lambda _line: None)
    todo = [p for p in pins if slow or not p.slow]
    for p in pins:
        if p not in todo:
            for m, v in p.metrics.items():
                report.lines.append(Line(p.name, m, v, None, p.tolerance, "SKIP", "slow (run with --slow)"))
                say(report.lines[-1].format())
    for p in todo:
        if not (data / p.collection / "qrels.tsv").is_file():
            raise PinFileError(f"pin {p.name!r}: collection {p.collection!r} not found under {data} (set RETRIEVER_DATA)")
    with tempfile.TemporaryDirectory(prefix="regression-") as tmp:
        root = Path(index_dir) if index_dir is not None else Path(tmp)
        opened: dict[tuple[str, tuple[str, ...]], Any] = {}
        for p in todo:
            key = (p.collection, p.legs)
            if key not in opened:
                out = root / f"{p.collection}-{'-'.join(p.legs)}"
                if not (out / "CURRENT").is_file():  # an index already built there is reused
                    t0 = time.perf_counter()
                    build_index(data / p.collection, out, legs=p.legs, show_progress=False)
                    report.seconds[f"build {out.name}"] = time.perf_counter() - t0
                opened[key] = Retriever.open(out)
            t0 = time.perf_counter()
            got = evaluate_index(opened[key], read_queries(data / p.collection / "queries.jsonl"),
                                 read_qrels(data / p.collection / "qrels.tsv"), mode=p.mode, k=p.k,
                                 fusion=p.fusion, depth=p.depth, leg_params=p.leg_params)
            report.seconds[f"eval {p.name}"] = time.perf_counter() - t0
            for m, v in p.metrics.items():
                ok = math.isfinite(got[m]) and abs(got[m] - v) <= p.tolerance
                report.lines.append(Line(p.name, m, v, got[m], p.tolerance, "OK" if ok else "FAIL"))
                say(report.lines[-1].format())
        opened.clear()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m tests.regression.run", description=__doc__.splitlines()[0])
    ap.add_argument("--slow", action="store_true", help="also run the pins marked slow (encoder-heavy)")
    ap.add_argument("--only", action="append", default=None,
                    help="run only pins whose name contains this text (repeatable)")
    ap.add_argument("--file", default=str(EXPECTED), help="pin file (default: expected.yaml beside this module)")
    ap.add_argument("--index-dir", default=None, help="build indexes here and reuse them (default: a temporary folder)")
    args = ap.parse_args(argv)
    from retriever.index.errors import RetrieverError

    try:
        pins = load_pins(args.file)
        if args.only:
            pins = [p for p in pins if any(s in p.name for s in args.only)]
        t0 = time.perf_counter()
        report = check(pins, slow=args.slow, index_dir=Path(args.index_dir) if args.index_dir else None)
    except (PinFileError, RetrieverError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = {s: sum(line.status == s for line in report.lines) for s in ("OK", "FAIL", "SKIP")}
    print(f"{n['OK']} OK, {n['FAIL']} FAIL, {n['SKIP']} skipped in {time.perf_counter() - t0:.1f} s "
          f"({', '.join(f'{k} {v:.1f} s' for k, v in report.seconds.items())})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
