"""Resolving a model argument to a local Hugging Face checkpoint directory (shared by encoders)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Mapping

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


def query_model(given: str | Path | None, info: Mapping[str, Any] | None, default: Callable[[], str]) -> str | None:
    """The query encoder of a leg: the caller's model, else the bundled default; never a path the
    index names (an index from elsewhere must not choose what is loaded).

    Args:
        given: the caller's model directory (``Retriever.open(..., dense_model=...)``), or None.
        info: the manifest's ``models[leg]`` entry (a fingerprint: name, weight SHA-256s).
        default: returns the bundled model's directory.

    Returns:
        the directory to load, or None when the index's vectors were given precomputed and the
        caller named no model (the leg then needs query vectors).
    """
    if given is not None:
        return str(given)
    if isinstance(info, Mapping) and info.get("precomputed"):
        return None
    return default()


def check_fingerprint(kind: str, path: Path, info: Mapping[str, Any] | None, where: str) -> None:
    """Compare a query model's safetensors weights with the fingerprint the index recorded.

    Args:
        kind: ``"dense"`` or ``"sparse"``; ``path``: the model directory about to be loaded;
        info: the manifest's ``models[kind]`` (``name``, ``sha256``: weight file -> hex digest);
            nothing is compared when it records no safetensors digest (precomputed vectors).
        where: the manifest (named in the message).

    Raises:
        ModelError: a recorded weight file is missing or differs (names both models).
    """
    from ..format import sha256_file

    if not isinstance(info, Mapping) or not isinstance(info.get("sha256"), Mapping):
        return
    want = {k: v for k, v in info["sha256"].items() if str(k).endswith(".safetensors")}
    if not want:
        return
    have = {p.name: sha256_file(p) for p in sorted(path.glob("*.safetensors")) if p.is_file()}
    if any(have.get(k) != v for k, v in want.items()):
        def short(d: Mapping[str, Any]) -> str:
            return ", ".join(f"{k} {str(v)[:12]}" for k, v in sorted(d.items())) or "no safetensors weights"
        raise ModelError(f"{where}: the index was built with the {kind} model {info.get('name')!r} ({short(want)}), "
                         f"but the query model {str(path)!r} has {short(have)}; pass {kind}_model= the model "
                         f"the index was built with")
