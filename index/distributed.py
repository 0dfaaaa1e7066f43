"""Where a build or a search runs: :class:`RayExecutor` (a Ray cluster) — the only executor
besides the default one-process path.

This module never imports Ray at import time (the core library does not depend on it); Ray is
imported when an executor connects. ``pip install -e '.[ray]'`` installs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .errors import ConfigError, DistributedError


@dataclass(frozen=True)
class RayExecutor:
    """Run a build (:func:`retriever.build_index`) or a search (``Retriever.open(path,
    executor=...)``) on a Ray cluster.

    Args:
        address: the cluster to join (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            ``None``: an already initialised Ray in this process, else what ``ray.init()`` finds
            (``RAY_ADDRESS``, or a cluster ``ray start`` started on this machine), else a new
            local one-machine cluster.
        num_workers: search: shard-holding actors (at most one per shard); build: encoder actors
            (the ``ActorPoolStrategy`` size) and concurrent shard builders.
        num_gpus_per_worker: GPUs each encoder / searcher actor asks for (0: CPU only). A value
            > 0 also makes it encode on ``cuda``; it is a scheduling request, so the cluster must
            have GPUs.
        num_cpus_per_worker: CPUs each actor asks for from the scheduler (fractions allowed).
        max_restarts: times a dead actor is restarted (its pending calls retried transparently);
            a build task is retried as often. After that the call fails with
            :class:`~retriever.index.errors.DistributedError`.
        assignment: search only: ``assignment[i]`` lists the shard positions actor ``i`` holds
            (every shard exactly once). Default: :meth:`assign` (contiguous runs of shards with
            about equal document counts).
        runtime_env: passed to ``ray.init`` when this executor starts or joins a cluster (e.g.
            ``{"working_dir": ...}`` on a remote cluster whose nodes lack the package).
        encoder_threads: torch threads of each build encoder actor. Default: the driver's
            ``torch.get_num_threads()``, what a one-process build on the driver uses: torch's CPU
            kernels round differently with other thread counts, so this keeps the vectors
            bit-identical to a one-process build (at the cost of oversubscribing a node that runs
            several actors); set it to trade exactness (last-bit differences) for less contention.

    Raises:
        ConfigError: a count or an assignment out of range (at construction or :meth:`assign`).
    """

    address: str | None = None
    num_workers: int = 2
    num_gpus_per_worker: float = 0
    num_cpus_per_worker: float = 1
    max_restarts: int = 1
    assignment: Sequence[Sequence[int]] | None = None
    runtime_env: dict[str, Any] | None = None
    encoder_threads: int | None = None

    def __post_init__(self) -> None:
        if self.encoder_threads is not None and (isinstance(self.encoder_threads, bool) or not isinstance(
                self.encoder_threads, int) or self.encoder_threads < 1):
            raise ConfigError(f"RayExecutor encoder_threads must be an integer >= 1 or None, got {self.encoder_threads!r}")
        for name, low in (("num_workers", 1), ("max_restarts", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"RayExecutor {name} must be an integer >= {low}, got {v!r}")
        for name in ("num_gpus_per_worker", "num_cpus_per_worker"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"RayExecutor {name} must be a number >= 0, got {v!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise ConfigError(f"RayExecutor address must be a string or None, got {self.address!r}")

    def connect(self) -> Any:
        """Import Ray and join (or start) the cluster once per process; returns the ``ray`` module.

        Raises:
            ConfigError: Ray is not installed (names the extra to install).
            DistributedError: the cluster at ``address`` cannot be reached.
        """
        try:
            import ray
        except ImportError:
            raise ConfigError("RayExecutor needs Ray: pip install 'retriever[ray]' (ray[data] 2.60)") from None
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, runtime_env=self.runtime_env, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise DistributedError(f"cannot reach the Ray cluster at {self.address or 'a new local cluster'}: "
                                       f"{e}") from None
        return ray

    def assign(self, rows: Sequence[int]) -> list[list[int]]:
        """The shards each search actor holds: the explicit ``assignment``, or contiguous runs of
        shard positions, at most ``num_workers`` of them and never empty, cut where the running
        document count crosses ``j * total / workers`` (shard ``i`` goes to run
        ``floor(workers * (docs before i + rows_i / 2) / total)``), so the runs hold about equal
        numbers of documents and every actor scans a contiguous range of ordinals.

        Args:
            rows: documents per shard, in shard order.

        Returns:
            one non-empty list of shard positions per actor.

        Raises:
            ConfigError: an explicit assignment that does not hold every shard exactly once.
        """
        n = len(rows)
        if self.assignment is not None:
            parts = [[int(s) for s in p] for p in self.assignment]
            flat = sorted(s for p in parts for s in p)
            if flat != list(range(n)) or any(not p for p in parts):
                raise ConfigError(f"RayExecutor assignment must list every shard 0..{n - 1} exactly once in "
                                  f"non-empty groups, got {[list(p) for p in self.assignment]}")
            return parts
        workers = max(1, min(self.num_workers, n))
        total = sum(int(r) for r in rows)
        out: list[list[int]] = [[] for _ in range(workers)]
        before = 0
        for i, r in enumerate(rows):
            mid = before + r / 2
            g = min(workers - 1, int(workers * mid / total)) if total else i * workers // max(n, 1)
            out[g].append(i)
            before += r
        parts = [p for p in out if p]
        if len(parts) < workers:  # a very large shard swallowed a run: equal runs of shards instead
            parts = [[] for _ in range(workers)]
            for i in range(n):
                parts[i * workers // n].append(i)
        return parts
