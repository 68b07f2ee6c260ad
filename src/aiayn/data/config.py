"""`DataConfig` and `TokenizerConfig`: the data pipeline's settings. Field names are the Hydra
keys users type (`data.max_tokens=8192`), so they are a public contract: add, never rename.
The YAML files in `conf/data/` hold only these keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional  # noqa: UP035 (OmegaConf structured configs)

SOURCES = ("toy", "multi30k", "files", "hf")
ROLES = ("train", "val", "test")


def _positive_int(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


@dataclass
class TokenizerConfig:
    """How to get the BPE tokenizer(s).

    path: a `tokenizer.json` (joint) or a directory written by `Tokenizers.save`; when set, it
    is loaded and nothing is trained (its special tokens must be `<pad>,<bos>,<eos>,<unk>` with
    ids 0-3). Otherwise BPE is trained on the train split: one vocabulary for both sides when
    `joint` (needed for `model.share_embeddings=all`), else one per side.
    """

    path: Optional[str] = None  # noqa: UP045
    vocab_size: int = 8000
    joint: bool = True
    lowercase: bool = False
    nfkc: bool = True
    min_frequency: int = 2

    def __post_init__(self) -> None:
        _positive_int("TokenizerConfig", "vocab_size", self.vocab_size)
        _positive_int("TokenizerConfig", "min_frequency", self.min_frequency)
        if self.vocab_size <= 4:
            raise ValueError(
                f"TokenizerConfig.vocab_size must exceed the 4 special tokens, got "
                f"{self.vocab_size}; use a few thousand for real corpora"
            )


@dataclass
class DataConfig:
    """Where the parallel text comes from and how it becomes batches.

    source: 'toy' (generated, offline; `toy_*` sizes and seed), 'multi30k'
    (`{root}/{split}.{lang}`), 'files' (`files`: split role -> [src, tgt] line-aligned text
    files, or [one .tsv with a header row / .jsonl] with fields `src_field`/`tgt_field`,
    optionally under `parent_field`), 'hf' (a Hugging Face dataset `hf_name`/`hf_config`,
    optional `hf_data_files`, fields as for files, e.g. parent_field 'translation').
    `train_split`/`val_split`/`test_split` name the source's splits (multi30k: 'test2016',
    hf: e.g. 'validation'); in the cache and the API they are always 'train'/'val'/'test'.
    Train pairs with an empty side, a side longer than `max_len` tokens or a token-length
    ratio above `max_ratio` are dropped; val/test are kept whole (over-long: truncated).
    `max_tokens` bounds each batch's padded size per side, incl. BOS/EOS.
    """

    source: str = "toy"
    src_lang: str = "en"
    tgt_lang: str = "de"
    root: Optional[str] = None  # noqa: UP045
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
        if self.source not in SOURCES:
            raise ValueError(f"DataConfig.source must be one of {SOURCES}, got {self.source!r}")
        for name in ("toy_train_size", "toy_val_size", "toy_test_size", "max_len", "max_tokens"):
            _positive_int("DataConfig", name, getattr(self, name))
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
        if self.source == "multi30k" and not self.root:
            raise ValueError("DataConfig.root must name the Multi30k directory for source=multi30k")
        if self.source == "files":
            if sorted(self.files) != sorted(ROLES):
                raise ValueError(
                    f"DataConfig.files must map each of {ROLES} to [src, tgt] text files or "
                    f"[one .tsv/.jsonl file], got keys {sorted(self.files)}"
                )
            for role, paths in self.files.items():
                if len(paths) not in (1, 2):
                    raise ValueError(
                        f"DataConfig.files.{role} must list 2 text files or 1 .tsv/.jsonl "
                        f"file, got {list(paths)}"
                    )
        if self.source == "hf" and not self.hf_name:
            raise ValueError("DataConfig.hf_name must name a dataset (e.g. wmt14) for source=hf")
