"""Run a living-index change that kills itself (SIGKILL) at one fault point, for crash-safety tests.

``python tests/crash_update.py POINT[:N] JOB_JSON``: ``POINT`` is a point of
``retriever.index.faults.UPDATE_CRASH_POINTS`` (or a build point the leg builders reach), ``N`` the
occurrence to die at (default the first); ``JOB_JSON`` is ``{"dir": ..., "add": [records],
"delete": [ids], "compact": bool}``: the adds and deletes are committed once, then (with
``compact``) a full compaction commits again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's retriever

from crash_build import CrashAt  # noqa: E402


def main() -> int:
    point, _, nth = sys.argv[1].partition(":")
    job = json.loads(sys.argv[2])
    from retriever import IndexUpdater

    with IndexUpdater.open(job["dir"], faults=CrashAt(point, int(nth) if nth else 1)) as u:
        if job.get("add"):
            u.add(job["add"])
        if job.get("delete"):
            u.delete(job["delete"])
        u.commit()
        if job.get("compact"):
            u.compact(full=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
