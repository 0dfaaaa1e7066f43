"""Resolving a model argument to a local Hugging Face checkpoint directory (shared by encoders)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from ..errors import ModelError

#: Held while a checkpoint is loaded: transformers' ``from_pretrained`` swaps process-wide
#: functions (``torch.nn.init.*``, ``PreTrainedModel.init_weights``) for no-ops and restores them
#: afterwards, so two loads in parallel threads (a hybrid query's legs run side by side) can leave
#: them disabled for good and every later load fails ("Cannot copy out of meta tensor").
LOAD_LOCK = threading.Lock()


def resolve_checkpoint(model: str | None, default: Callable[[], str], kind: str) -> Path:
    """Return the checkpoint directory for ``model`` (``None`` = ``default()``).

    Args:
        model: a local directory, or ``None`` for the bundled default.
        default: returns the bundled model's directory (raises ModelError when not installed).
        kind: ``"dense"`` or ``"sparse"``, for messages.

    Raises:
        ModelError: the path does not exist, is not a directory, or holds no ``config.json``.
    """
    path = Path(model if model is not None else default())
    if not path.is_dir():
        raise ModelError(f"{kind} model path does not exist or is not a directory: {str(path)!r}")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: not a Hugging Face checkpoint (no config.json)")
    return path
