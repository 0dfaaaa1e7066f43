"""Holding a call's thread budget in the libraries a leg calls: FAISS's OpenMP team and BLAS.

The C++ kernels take their thread count as an argument. FAISS (OpenMP) and BLAS (numpy's
OpenBLAS for the prefix scan, FAISS's own for flat search) size their teams from their own
settings, so a call with ``n_threads=1`` used to run FAISS and BLAS on every core.
:func:`thread_limits` sets both for the duration of a leg's search.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_OMP_LOCAL = threading.local()  # per thread: the OpenMP thread count this module last set there


class omp_threads:
    """Context manager: OpenMP threads of the *calling* thread (FAISS's OpenMP setting is per
    thread) set to ``n``, restored afterwards (``restore=False``: left set, for the engine's own
    pool workers). No-op when FAISS has not been imported.

    The value this module set in a thread is remembered (thread-local), so a pool worker that
    already runs with ``n`` OpenMP threads makes no FAISS call at all: every FAISS call releases
    and re-takes the GIL, and with another leg's thread running Python code at that moment the
    re-take can wait, which showed up in the hybrid p99."""

    def __init__(self, n: int, restore: bool = True) -> None:
        self.n = n
        self.restore = restore
        self.prev: int | None = None
        self.faiss = sys.modules.get("faiss")

    def __enter__(self) -> None:
        if self.faiss is None:
            return
        if not self.restore and getattr(_OMP_LOCAL, "n", None) == self.n:
            return
        if self.restore:
            self.prev = int(self.faiss.omp_get_max_threads())
            if self.prev == self.n:
                self.prev = None
                return
        self.faiss.omp_set_num_threads(self.n)
        _OMP_LOCAL.n = self.n

    def __exit__(self, *exc: Any) -> None:
        if self.faiss is not None and self.prev is not None:
            self.faiss.omp_set_num_threads(self.prev)
            _OMP_LOCAL.n = self.prev


def _release_openblas_control() -> None:
    """Let the calling thread set OpenBLAS's process-wide thread count, and leave no thread owning it.

    threadpoolctl (≥ 3.6) lets only one thread, the first to set a limit, change a pthreads
    OpenBLAS's thread count and makes every other thread's calls silent no-ops until that
    ownership is released; it is released only by ``with threadpool_limits()``'s exit on the thread
    that took it. This limiter applies and restores under its own lock from whichever thread
    holds a limit (an engine pool thread that stays alive, then the main thread), so it releases
    the ownership before and after each change; otherwise a limit set from one thread made every
    later limit from another thread silently do nothing.
    """
    from threadpoolctl import OpenBLASController

    OpenBLASController.clear_controlling_thread(force=True)


class _BlasLimit:
    """Process-wide BLAS thread limit shared by concurrent calls: while any call holds a limit,
    every BLAS library runs with the smallest limit held; when the last one leaves, the
    libraries' own settings come back. (Nested per-call limits restored in another order than
    they were set would leave a stale value behind.) BLAS libraries are found and set by
    threadpoolctl, a well-kept library."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[int] = []
        self._controller: Any = None
        self._n_modules = 0  # len(sys.modules) when the controller was built
        self._limiters: list[Any] = []  # the limits applied while held, oldest first

    def _apply(self, n: int) -> Any:
        # a BLAS library is loaded by an import (numpy, faiss, scipy.linalg, torch, ...): the
        # controller (~5 ms to build: it walks the loaded shared objects) is rebuilt when modules
        # were imported since, so a library loaded after the first limit is limited too
        if self._controller is None or self._n_modules != len(sys.modules):
            from threadpoolctl import ThreadpoolController
            self._controller = ThreadpoolController()
            self._n_modules = len(sys.modules)
        _release_openblas_control()
        try:
            return self._controller.limit(limits=n, user_api="blas")
        finally:
            _release_openblas_control()

    def enter(self, n: int) -> None:
        with self._lock:
            self._held.append(n)
            # a new holder below the others, or a library loaded since the last limit (a limit
            # held by another call does not cover it): (re)apply the smallest limit held
            if len(self._held) == 1 or n < min(self._held[:-1]) or self._n_modules != len(sys.modules):
                self._limiters.append(self._apply(min(self._held)))

    def exit(self, n: int) -> None:
        with self._lock:
            self._held.remove(n)
            if not self._held:
                # newest first: each limiter restores what it found, so the libraries end with
                # their own settings (a library loaded while limits were held included)
                _release_openblas_control()
                try:
                    for lim in reversed(self._limiters):
                        lim.restore_original_limits()
                finally:
                    _release_openblas_control()
                self._limiters.clear()
            elif n < min(self._held):
                self._limiters.append(self._apply(min(self._held)))


_BLAS = _BlasLimit()


@contextmanager
def thread_limits(n: int, *, restore: bool = True) -> Iterator[None]:
    """Hold FAISS's OpenMP team (calling thread) and every BLAS library to ``n`` threads.

    BLAS thread counts are process-wide (see :class:`_BlasLimit`); they are only limited when
    ``n`` is below the machine's core count, so the default budget costs nothing (a limit costs
    ~20 µs).
    """
    n = max(1, int(n))
    limit_blas = n < (os.cpu_count() or 1)
    with omp_threads(n, restore=restore):
        if not limit_blas:
            yield
            return
        _BLAS.enter(n)
        try:
            yield
        finally:
            _BLAS.exit(n)


#: Intra-op threads torch runs query encoding on, whatever thread (or call budget) encodes:
#: torch's float32 reductions split by thread count, so the same query encoded on 1 and on 2
#: threads differed in the last digit of some weights. One thread keeps a query's vector
#: independent of the caller's thread and of ``n_threads`` (and within any call's budget).
QUERY_ENCODE_THREADS = 1


class _TorchThreads:
    """Blocks of torch work on a given intra-op thread count, side by side in a process.

    torch.set_num_threads reaches process-wide state (MKL's thread count) beside the calling
    thread's OpenMP setting, so one thread's encode could run on the count another thread's
    block had just restored: the same query then got other float bits when two legs encoded
    side by side (seen on an AMD EPYC VM: a pool thread's SPLADE weights differed in the last
    digit from the calling thread's). Here blocks of the same count run together and the count
    is set by each on entry; a block restores its thread's previous count only once no block is
    running (it waits for the others to end), and a block of another count waits for the running
    ones to end first. So every block runs on exactly its count from start to end.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._n: int | None = None
        self._active = 0
        self._depth = threading.local()  # blocks the thread is inside

    @contextmanager
    def hold(self, torch: Any, n: int) -> Iterator[None]:
        """The calling thread's torch work on ``n`` threads for the block (see the class). A
        block inside another of the same thread runs on the outer block's count (it would
        otherwise wait for itself to end). An error or interrupt (KeyboardInterrupt) while a
        block starts or waits to restore still ends it as above (the count restored, the other
        blocks' waits ended), then is raised. A block must not wait for a block of another
        thread (e.g. a search running its legs on the engine's pool inside ``torch_threads``):
        that block's end waits for this one."""
        depth = getattr(self._depth, "n", 0)
        if depth:
            self._depth.n = depth + 1
            try:
                yield
            finally:
                self._depth.n = depth
            return
        counted = False
        try:
            with self._cond:
                while self._active and self._n != n:
                    self._cond.wait()
                prev = int(torch.get_num_threads())
                # counted before torch is set: from here on the exit below runs (and restores prev)
                # whatever is raised, so no block is left behind that every later one waits for
                self._active += 1
                counted = True
                self._n = n
                torch.set_num_threads(n)  # also when prev == n: the shared part may hold another count
            self._depth.n = 1
            yield
        finally:
            if counted:
                self._depth.n = 0
                self._leave(torch, prev)

    def _leave(self, torch: Any, prev: int) -> None:
        """The end of a block: once no block runs, the thread's count back to ``prev``. An
        interrupt while it waits is raised after the restore (the running blocks end soon)."""
        raised: BaseException | None = None
        with self._cond:
            self._active -= 1
            try:
                while self._active:  # the shared count must stay n while the others run
                    try:
                        self._cond.wait()
                    except BaseException as e:  # e.g. KeyboardInterrupt: restore first
                        raised = e
                torch.set_num_threads(prev)
            finally:  # also when the restore raised: the others' waits end
                self._cond.notify_all()
        if raised is not None:
            raise raised


_TORCH_THREADS = _TorchThreads()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch's intra-op work of the calling thread on ``n`` threads, restored afterwards
    (:class:`_TorchThreads`: blocks of one count run side by side, each on exactly that count).
    No-op when torch has not been imported.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    with _TORCH_THREADS.hold(torch, n):
        yield
