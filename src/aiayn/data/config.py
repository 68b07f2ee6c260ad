"""`DataConfig` and `TokenizerConfig`: the data pipeline's settings. Field names are the Hydra
keys users type (`data.max_tokens=8192`), so they are a public contract: add, never rename.
The YAML files in `conf/data/` hold only these keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional  # noqa: UP035 (OmegaConf structured configs)

ROLES = ("train", "val", "test")


def positive_int(owner: str, name: str, value: object) -> None:
    """Raise ValueError naming `{owner}.{name}` unless value is an int > 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


TOKENIZER_MODELS = ("bpe", "unigram")


@dataclass
class TokenizerConfig:
    """How to get the subword tokenizer(s).

    path: a `tokenizer.json` (joint) or a directory written by `Tokenizers.save`; when set, it
    is loaded and nothing is trained (its special tokens must be `<pad>,<bos>,<eos>,<unk>` with
    ids 0-3). Otherwise one is trained on the train split: one vocabulary for both sides when
    `joint` (needed for `model.share_embeddings=all`), else one per side. `model`: 'bpe'
    (byte-pair merges) or 'unigram' (the unigram language model of SentencePiece;
    `min_frequency` is BPE's only).
    """

    path: Optional[str] = None  # noqa: UP045
    model: str = "bpe"
    vocab_size: int = 8000
    joint: bool = True
    lowercase: bool = False
    nfkc: bool = True
    min_frequency: int = 2

    def __post_init__(self) -> None:
        positive_int("TokenizerConfig", "vocab_size", self.vocab_size)
        positive_int("TokenizerConfig", "min_frequency", self.min_frequency)
        if self.model not in TOKENIZER_MODELS:
            raise ValueError(
                f"TokenizerConfig.model={self.model!r} is unknown; use one of {TOKENIZER_MODELS}"
            )
        if self.vocab_size <= 4:
            raise ValueError(
                f"TokenizerConfig.vocab_size must exceed the 4 special tokens, got "
                f"{self.vocab_size}; use a few thousand for real corpora"
            )


@dataclass
class DataConfig:
    """Where the parallel text comes from and how it becomes batches.

    source: the corpus kind, a name in `aiayn.data.sources.SOURCES` ('toy', 'multi30k',
    'files', 'hf'); each source class's docstring says what it reads and which of the fields
    below it uses. `train_split`/`val_split`/`test_split` name the source's splits (multi30k:
    'test2016', hf: e.g. 'validation'); in the cache and the API they are always
    'train'/'val'/'test'.
    Train pairs with an empty side, a side longer than `max_len` tokens or a token-length
    ratio above `max_ratio` are dropped; val/test are kept whole (over-long: truncated).
    `max_tokens` bounds each batch's padded size per side, incl. BOS/EOS.
    `download_url`: base URL of the Multi30k task-1 release that source=multi30k downloads
    splits missing under `root` from (`<download_url>/<name>.<lang>.gz`, checked against
    the release checksums, kept under `cache_dir`); None: the official GitHub release.
    """

    source: str = "toy"
    src_lang: str = "en"
    tgt_lang: str = "de"
    root: Optional[str] = None  # noqa: UP045
    download_url: Optional[str] = None  # noqa: UP045 (None: the official release)
    train_split: str = "train"
    val_split: str = "val"
    test_split: str = "test"
    files: Dict[str, List[str]] = field(default_factory=dict)  # noqa: UP006
    src_field: Optional[str] = None  # noqa: UP045 (default: src_lang)
    tgt_field: Optional[str] = None  # noqa: UP045 (default: tgt_lang)
    parent_field: Optional[str] = None  # noqa: UP045
    hf_name: Optional[str] = None  # noqa: UP045
    hf_config: Optional[str] = None  # noqa: UP045
    hf_revision: Optional[str] = None  # noqa: UP045
    hf_data_files: Dict[str, str] = field(default_factory=dict)  # noqa: UP006
    toy_train_size: int = 20000
    toy_val_size: int = 500
    toy_test_size: int = 500
    toy_seed: int = 1234
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    max_len: int = 128
    max_ratio: float = 3.0
    max_tokens: int = 4096
    cache_dir: str = ".cache/aiayn"
    num_workers: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def split_names(self) -> Dict[str, str]:  # noqa: UP006
        """Role ('train'/'val'/'test') -> the source's split name."""
        return {"train": self.train_split, "val": self.val_split, "test": self.test_split}

    @property
    def fields(self) -> tuple[str, str]:
        """(source field, target field) of TSV/JSONL/HF records."""
        return self.src_field or self.src_lang, self.tgt_field or self.tgt_lang

    def validate(self) -> None:
        """Raise ValueError naming the offending field(s) and what to do."""
        from aiayn.data.sources import get_source  # here: the sources import this module

        source = get_source(self)
        for name in ("max_len", "max_tokens"):
            positive_int("DataConfig", name, getattr(self, name))
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"DataConfig.num_workers must be >= 0, got {self.num_workers!r}")
        if not self.max_ratio >= 1.0:
            raise ValueError(f"DataConfig.max_ratio must be >= 1, got {self.max_ratio!r}")
        if self.max_tokens < self.max_len + 2:
            raise ValueError(
                f"DataConfig.max_tokens={self.max_tokens} is smaller than the longest allowed "
                f"pair (max_len + 2 = {self.max_len + 2} slots incl. BOS/EOS): raise "
                f"data.max_tokens or lower data.max_len"
            )
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"DataConfig.src_lang and tgt_lang are both {self.src_lang!r}")
        source.validate()
