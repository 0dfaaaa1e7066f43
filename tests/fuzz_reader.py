"""Child process of the reader fuzz test (tests/test_untrusted.py): opens and searches many
mutated index directories, one after another, under a memory cap, and prints one JSON line per
case as soon as it ends (so the parent knows which case hung or killed the process).

Usage: ``python fuzz_reader.py CANARY_DIR WARMUP_INDEX MEMORY_CAP_BYTES CASE_DIR...``: the
unmutated WARMUP_INDEX is opened and searched first (libraries load lazily: numba's LLVM, FAISS's
OpenMP), then the address space is capped at what the process uses plus MEMORY_CAP_BYTES.

For each case the line is ``{"case", "outcome", "detail"}`` with outcome ``ok`` (opened and
searched), ``error`` (a RetrieverError whose message names a file of the case's index),
``unnamed`` (a RetrieverError not naming one), ``other`` (any other exception) or ``outside``
(a file under CANARY_DIR, which holds the targets of the cases' symlinks, was opened: seen by an
audit hook for Python-level opens and by inotify for every open, FAISS's and Arrow's included).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import sys
import traceback

import numpy as np

from retriever import Retriever
from retriever.index.errors import RetrieverError

IN_OPEN = 0x20
IN_ACCESS = 0x01
IN_NONBLOCK = 0o4000
_opened: list[str] = []


def _inotify(canary: str) -> int:
    """An inotify descriptor watching every file in ``canary`` (and subfolders) for opens."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    if fd < 0:
        return -1
    for dirpath, dirnames, _ in os.walk(canary):
        libc.inotify_add_watch(fd, dirpath.encode(), IN_OPEN | IN_ACCESS)
    return fd


def _drain(fd: int) -> int:
    """Number of pending inotify events (read and discarded)."""
    n = 0
    while fd >= 0:
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            break
        pos = 0
        while pos + 16 <= len(buf):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, pos)
            pos += 16 + length
            n += 1
    return n


def _audit(canary: str):
    real = os.path.realpath(canary)

    def hook(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            p = os.fsdecode(args[0])
            if "/" in p:
                rp = os.path.realpath(p)
                if rp == real or rp.startswith(real + os.sep):
                    _opened.append(rp)
    return hook


def run_case(path: str, qv: np.ndarray) -> None:
    """Open ``path`` and search it in every mode it offers (raises what the library raises)."""
    r = Retriever.open(path)
    r.search_batch(["vitamin bone", "the", "heart blood pressure"], k=5, mode="bm25")
    if "dense" in r.legs:
        leg = r.engine.legs["dense"]
        q = np.resize(qv, (2, leg.dim)).astype(np.float32)
        r.search_batch(["a", "b"], k=5, mode="dense", query_vectors=q)
        r.search_arrays(["a", "b"], k=5, mode="dense", query_vectors=q,
                        leg_params={"dense": {"nprobe": 2, "rescore": False}})
        r.search_arrays(["a", "b"], k=5, mode="dense", query_vectors=q, leg_params={"dense": {"dim": max(1, leg.dim // 2)}})
        r.search_batch(["vitamin", "cell"], k=5, mode="hybrid", query_vectors=q)
    r.doc_ids(np.arange(min(3, r.reader.n_docs)))
    Retriever.open(path, verify=True)


def _vm_size() -> int:
    """This process's address-space size in bytes (VmSize)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    canary, warmup, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cases = sys.argv[4:]
    qv = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    run_case(warmup, qv)
    print("WARMUP OK", flush=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + extra, hard))
    sys.addaudithook(_audit(canary))
    ino = _inotify(canary)
    for case in cases:
        _opened.clear()
        _drain(ino)
        outcome, detail = "ok", ""
        try:
            run_case(case, qv)
        except RetrieverError as e:
            msg = str(e)
            outcome, detail = ("error" if case in msg else "unnamed"), f"{type(e).__name__}: {msg[:300]}"
        except BaseException as e:  # noqa: BLE001 - every other exception is a finding
            outcome, detail = "other", f"{type(e).__name__}: {str(e)[:300]} | {traceback.format_exc()[-600:]}"
        if _opened or _drain(ino):
            outcome, detail = "outside", f"opened {_opened[:3] or 'a file (inotify)'}; was {outcome}: {detail[:200]}"
        print(json.dumps({"case": case, "outcome": outcome, "detail": detail}), flush=True)


if __name__ == "__main__":
    main()
