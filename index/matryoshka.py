"""Matryoshka dense vectors: nested prefixes of one stored vector, with a PCA rotation for models
not trained with MRL.

Matryoshka Representation Learning (Kusupati et al., "Matryoshka Representation Learning",
NeurIPS 2022) trains embeddings whose first ``m`` coordinates are themselves a usable embedding.
Ordinary sentence encoders (e.g. all-MiniLM-L6-v2) are not trained that way, so their prefixes
are poor. An orthogonal rotation onto the principal axes of the document vectors (PCA, fitted at
build time on a sample) sorts the coordinates by variance, so a prefix keeps as much of the
variance as any ``m``-dimensional linear projection can. Because the rotation ``R`` is orthogonal,
full-dimension inner products are unchanged: ``(q R)·(d R) = q·d``.

Storage: each document vector is stored once (rotated when a rotation is used) in the shards'
``dense.arrow``; the rotation is an Arrow array file ``matryoshka.arrow`` (``rotation`` float32
``d*d`` row-major, ``mean`` float32 ``d``, ``dims`` int32) listed in the manifest, with a
``"matryoshka"`` manifest entry ``{"dims", "rotation", "mrl_trained", "rotation_sample_rows"}``.
Loading it executes no code (plain Arrow arrays).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .config import check_dims
from .errors import ConfigError, IndexFormatError

__all__ = ["ROTATION_FILE", "MatryoshkaBuilder", "check_dims", "fit_pca_rotation", "load_rotation",
           "prefix_normalize", "to_storage"]

log = logging.getLogger(__name__)

FLOAT16_MAX = 65504.0
ROTATION_FILE = "matryoshka.arrow"


def fit_pca_rotation(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fit an orthogonal PCA rotation on a sample of vectors.

    The columns of the result are the eigenvectors of the sample covariance (centred), sorted by
    decreasing eigenvalue (ties and signs fixed deterministically: each column's largest-magnitude
    entry is positive). Vectors are rotated as ``x @ R`` and are *not* centred, so inner products
    are preserved exactly in real arithmetic.

    Args:
        sample: (n, d) float array, n >= 1.

    Returns:
        ``(R, mean)``: float32 (d, d) orthogonal matrix and the float32 (d,) sample mean.

    Raises:
        ConfigError: empty sample or non-finite values.
    """
    x = np.asarray(sample, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ConfigError(f"rotation sample must be a non-empty (n, d) array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ConfigError("rotation sample contains NaN or inf")
    mean = x.mean(axis=0)
    xc = x - mean
    cov = xc.T @ xc / max(x.shape[0] - 1, 1)
    evals, evecs = np.linalg.eigh(cov)
    order = np.argsort(-evals, kind="stable")
    R = evecs[:, order]
    idx = np.argmax(np.abs(R), axis=0)
    signs = np.sign(R[idx, np.arange(R.shape[1])])
    signs[signs == 0] = 1.0
    R = R * signs
    # Re-orthonormalise in float64 before the float32 cast (QR keeps column order and signs).
    q, r = np.linalg.qr(R)
    q = q * np.sign(np.diag(r))
    return q.astype(np.float32), mean.astype(np.float32)


def prefix_normalize(x: np.ndarray, dim: int) -> np.ndarray:
    """First ``dim`` coordinates of each row, re-normalised to unit L2 norm.

    Args:
        x: (n, d) float16/float32 vectors, ``1 <= dim <= d``.

    Returns:
        float32 C-contiguous (n, dim); rows whose prefix is all zeros stay zero (never NaN).

    Raises:
        ConfigError: ``dim`` out of range (names it).
    """
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= x.shape[1]:
        raise ConfigError(f"prefix dim must be an integer in [1, {x.shape[1]}], got {dim!r}")
    p = np.array(x[:, :dim], dtype=np.float32, order="C")
    norms = np.linalg.norm(p, axis=1, keepdims=True)
    np.divide(p, norms, out=p, where=norms > 0)
    return p


def to_storage(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """Cast vectors to the storage dtype without losing values.

    Args:
        vectors: (n, d) float array.
        dtype: ``"float16"`` or ``"float32"``.

    Returns:
        float16 array, or float32 when ``dtype == "float32"`` or when some value is outside
        float16's finite range (±65504; logged as a warning, never silently clipped to inf).

    Raises:
        ConfigError: NaN/inf in ``vectors`` or an unknown ``dtype``.
    """
    if dtype not in ("float16", "float32"):
        raise ConfigError(f"dense dtype must be 'float16' or 'float32', got {dtype!r}")
    v = np.asarray(vectors)
    if not np.isfinite(v).all():
        raise ConfigError("dense vectors contain NaN or inf")
    if dtype == "float16":
        if np.abs(v).max(initial=0.0) > FLOAT16_MAX:
            log.warning("dense values exceed float16's range (±%g); storing float32", FLOAT16_MAX)
            return v.astype(np.float32)
        return v.astype(np.float16)
    return v.astype(np.float32)


class MatryoshkaBuilder:
    """Build-time side: fits the rotation on the first shard, rotates and stores every shard.

    Args:
        dim: model dimension d.
        dims: Matryoshka prefix dims (each <= d).
        mrl_trained: no rotation (prefixes used as they are).
        dtype: requested storage dtype (``"float16"`` / ``"float32"``).
        rotation_sample: maximum sample rows for the PCA fit (seeded random subset).

    Raises:
        ConfigError: a prefix dim larger than the model dimension.
    """

    def __init__(self, dim: int, dims: Sequence[int], *, mrl_trained: bool = False, dtype: str = "float16",
                 rotation_sample: int = 100_000) -> None:
        self.dim = int(dim)
        self.dims = check_dims(dims)
        if self.dims and self.dims[-1] > self.dim:
            raise ConfigError(f"matryoshka_dims {self.dims} exceed the model dimension {self.dim}")
        self.mrl_trained = bool(mrl_trained)
        self.dtype = dtype
        self.rotation_sample = int(rotation_sample)
        self.rotation: np.ndarray | None = None
        self.mean: np.ndarray | None = None
        self.sample_rows = 0

    @property
    def rotates(self) -> bool:
        """True when a PCA rotation is used (Matryoshka dims given and the model is not MRL-trained)."""
        return bool(self.dims) and not self.mrl_trained

    def transform(self, vectors: np.ndarray) -> np.ndarray:
        """Rotate one shard's vectors (fitting the rotation on the first call) and cast to storage.

        Args:
            vectors: float32 (n, d) model-space vectors.

        Returns:
            (n, d) float16 or float32 stored vectors (see :func:`to_storage`); ``self.dtype``
            becomes ``"float32"`` if float16 could not hold the values.
        """
        v = np.asarray(vectors, dtype=np.float32)
        if self.rotates:
            if self.rotation is None:
                n = v.shape[0]
                take = np.arange(n)
                if n > self.rotation_sample:
                    take = np.sort(np.random.default_rng(0).choice(n, self.rotation_sample, replace=False))
                self.rotation, self.mean = fit_pca_rotation(v[take])
                self.sample_rows = int(len(take))
            v = v @ self.rotation
        out = to_storage(v, self.dtype)
        if out.dtype == np.float32:
            self.dtype = "float32"
        return out

    def finish(self, writer: Any) -> dict[str, Any]:
        """Write the rotation file (when fitted) through ``writer.write_file_arrays``.

        Returns:
            the manifest entry ``{"dims", "rotation", "mrl_trained", "rotation_sample_rows"}``
            (``rotation`` is the file name or ``None``).
        """
        entry: dict[str, Any] = {"dims": list(self.dims), "rotation": None, "mrl_trained": self.mrl_trained,
                                 "rotation_sample_rows": self.sample_rows}
        if self.rotation is not None:
            writer.write_file_arrays(ROTATION_FILE, {"rotation": self.rotation.reshape(-1), "mean": self.mean,
                                                     "dims": np.asarray(self.dims, dtype=np.int32)})
            entry["rotation"] = ROTATION_FILE
        return entry


def load_rotation(root: Path, manifest: dict[str, Any], dim: int, files: Any = None) -> np.ndarray | None:
    """Read the rotation of an index, if it has one.

    Args:
        root: index directory; ``manifest``: its manifest; ``dim``: the dense dimension d.
        files: the reader's :class:`~retriever.index.safe_open.IndexFiles` (default: one over
            ``root`` and the manifest's files).

    Returns:
        float32 (d, d) rotation matrix, or ``None`` when the index stores unrotated vectors.

    Raises:
        IndexFormatError: malformed ``matryoshka`` entry or rotation file (names the file).
    """
    m = manifest.get("matryoshka")
    if not m:
        return None
    if not isinstance(m, dict):
        raise IndexFormatError(f"{root / 'manifest.json'}: field 'matryoshka' is not an object")
    rel = m.get("rotation")
    if rel is None:
        return None
    if rel not in manifest.get("files", {}):
        raise IndexFormatError(f"{root / 'manifest.json'}: rotation file {rel!r} is not listed in files")
    if files is None:
        from .safe_open import IndexFiles
        files = IndexFiles(root, manifest["files"])
    path = files.path(rel)
    arrs = files.arrays(rel, {"rotation": np.float32, "mean": np.float32, "dims": np.int32})
    if not np.isfinite(arrs["rotation"]).all():
        raise IndexFormatError(f"{path}: rotation holds NaN or inf")
    if arrs["rotation"].size != dim * dim:
        raise IndexFormatError(f"{path}: rotation has {arrs['rotation'].size} values, expected {dim}x{dim}")
    return np.array(arrs["rotation"]).reshape(dim, dim)
