"""Start-up cost of the command line: wall time of ``python -m retriever --help``,
``python -m retriever index info INDEX`` and ``python -c "import retriever.cli"``, each a fresh
process, and which heavy modules each loads.

With ``--code-root CHECKOUT`` (another checkout's ``retriever`` with its built extension, e.g. the
code before a change) the two are timed in interleaved rounds, the order alternating per round;
round 0 only warms the page cache. Medians over rounds with the min-max spread, and the ratio of
the medians (this checkout / the other).

Run:  python -m benchmarks.bench_cli_startup --index DIR [--rounds 5] [--code-root CHECKOUT]
      [--out benchmarks/results/cli_startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
HEAVY = ("torch", "faiss", "ray", "transformers", "numba", "pandas", "scipy", "pyarrow.dataset", "pyarrow",
         "numpy", "retriever.api", "retriever.engine")


def _commands(index: str) -> dict[str, list[str]]:
    return {"help": ["-m", "retriever", "--help"], "index_info": ["-m", "retriever", "index", "info", index],
            "import_cli": ["-c", "import retriever.cli"]}


def _run(root: str, argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=root, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": ""})
    return time.perf_counter() - t0


def _loaded(root: str, argv: list[str]) -> list[str]:
    """The HEAVY modules in sys.modules after running the command's CLI call in-process."""
    if argv[0] == "-c":
        call = argv[1]
    else:
        call = ("import contextlib, io\nfrom retriever.cli import main\n"
                "with contextlib.redirect_stdout(io.StringIO()):\n"
                f"    try:\n        main({argv[2:]!r})\n    except SystemExit:\n        pass")
    code = f"{call}\nimport sys\nprint(' '.join(m for m in {list(HEAVY)!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""}).stdout
    return out.strip().splitlines()[-1].split() if out.strip() else []


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="an index directory (for index info)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--code-root", default=None, help="also time this checkout's retriever (interleaved rounds)")
    ap.add_argument("--code-root-label", default="BEFORE", help="what the results file says for --code-root")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    from benchmarks.timing import machine

    given = list(argv if argv is not None else sys.argv[1:])
    for i, a in enumerate(given[:-1]):  # the results file names no local paths
        if a in ("--code-root", "--index"):
            given[i + 1] = args.code_root_label if a == "--code-root" else "INDEX"
    roots = {"this": str(HERE.parents[1])}
    if args.code_root:
        roots["other"] = str(Path(args.code_root).resolve())
    cmds = _commands(str(Path(args.index).resolve()))
    times: dict[str, dict[str, list[float]]] = {v: {c: [] for c in cmds} for v in roots}
    for r in range(args.rounds + 1):
        order = list(roots) if r % 2 else list(reversed(roots))
        for c, cargv in cmds.items():
            for v in order:
                t = _run(roots[v], cargv)
                if r:
                    times[v][c].append(t)
    res: dict[str, Any] = {"machine": machine(), "load_average": os.getloadavg(),
                           "command": "python -m benchmarks.bench_cli_startup " + " ".join(given)}
    for v in roots:
        key = "this_code" if v == "this" else "other_code"
        res[key] = {c: {"seconds": _spread(times[v][c]), "loaded": _loaded(roots[v], cmds[c])} for c in cmds}
    if args.code_root:
        res["other"] = args.code_root_label
        res["ratio_this_over_other"] = {c: res["this_code"][c]["seconds"]["median"]
                                        / res["other_code"][c]["seconds"]["median"] for c in cmds}
    for c in cmds:
        line = f"{c:<11} this {res['this_code'][c]['seconds']['median']:.3f} s " \
               f"({res['this_code'][c]['seconds']['min']:.3f}-{res['this_code'][c]['seconds']['max']:.3f})"
        if args.code_root:
            o = res["other_code"][c]["seconds"]
            line += f"  {args.code_root_label} {o['median']:.3f} s ({o['min']:.3f}-{o['max']:.3f})" \
                    f"  ratio {res['ratio_this_over_other'][c]:.2f}"
        print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
