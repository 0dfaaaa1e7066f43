"""Scale-out on Ray: shard-holding search actors (:mod:`retriever.distributed.search`).

Imported only when an executor is given (``Retriever.open(path, executor=RayExecutor(...))``);
the rest of the library never imports Ray. The executor itself is
:class:`retriever.index.distributed.RayExecutor` (shared with the build side).
"""

from retriever.index.distributed import RayExecutor

__all__ = ["RayExecutor"]
