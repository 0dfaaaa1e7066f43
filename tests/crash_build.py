"""Run a build or an upgrade that kills itself (SIGKILL) at one fault point, for crash-safety tests.

``python tests/crash_build.py POINT[:N] JOB_JSON``: ``POINT`` is one of
``retriever.index.faults.CRASH_POINTS``, ``N`` the occurrence to die at (default the first);
``JOB_JSON`` is ``{"kind": "build", "corpus": ..., "out": ..., "overwrite": bool, "config": {...}}``
(``config``: ``build_index`` keyword overrides) or ``{"kind": "upgrade", "out": ...}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys


class CrashAt:
    """A fault hook that SIGKILLs this process at the ``nth`` call of ``point``."""

    def __init__(self, point: str, nth: int = 1) -> None:
        self.point, self.nth, self.count = point, nth, 0

    def __call__(self, name: str) -> None:
        if name == self.point:
            self.count += 1
            if self.count >= self.nth:
                os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    point, _, nth = sys.argv[1].partition(":")
    job = json.loads(sys.argv[2])
    hook = CrashAt(point, int(nth) if nth else 1)
    if job["kind"] == "upgrade":
        from retriever.index.upgrade import upgrade_index

        upgrade_index(job["out"], faults=hook)
    else:
        from retriever import build_index

        build_index(job["corpus"], job["out"], overwrite=job.get("overwrite", False), show_progress=False,
                    faults=hook, **job.get("config", {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
