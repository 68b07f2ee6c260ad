"""`DataConfig` and `TokenizerConfig`: the data pipeline's settings. Field names are the Hydra
keys users type (`data.max_tokens=8192`), so they are a public contract: add, never rename.
Each source's own settings are a dataclass of its module (`data.toy.*`, `data.hf.*`,
`data.multi30k.*`, `data.files.*`); the flat keys they replaced (`data.toy_train_size`,
`data.hf_name`, `data.download_url`, ...) are still accepted, with a warning naming the new
key. The YAML files in `conf/data/` hold only these keys."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional  # noqa: UP035 (OmegaConf structured configs)

from aiayn.data.checks import ROLES, positive_int
from aiayn.data.sources import get_source
from aiayn.data.sources.files import FilesConfig
from aiayn.data.sources.hf import HFConfig
from aiayn.data.sources.multi30k import Multi30kConfig
from aiayn.data.sources.toy import ToyConfig
from aiayn.schema import command_line_settings

__all__ = ["ALIASES", "ROLES", "DataConfig", "TokenizerConfig", "positive_int"]

log = logging.getLogger(__name__)

# the flat keys of the sources' settings before each source had its own: old key -> new key
ALIASES = {
    "toy_train_size": "toy.train_size",
    "toy_val_size": "toy.val_size",
    "toy_test_size": "toy.test_size",
    "toy_seed": "toy.seed",
    "hf_name": "hf.name",
    "hf_config": "hf.config",
    "hf_revision": "hf.revision",
    "hf_data_files": "hf.data_files",
    "download_url": "multi30k.download_url",
}
SOURCE_SETTINGS = {"toy": ToyConfig, "hf": HFConfig, "multi30k": Multi30kConfig}
SOURCE_SETTINGS |= {"files": FilesConfig}


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
    'files', 'hf'); its settings are the field of that name (`toy`, `multi30k`, `files`,
    `hf`: each source's docstring says what it reads). `root`: the directory a local corpus
    is under (multi30k, files). `train_split`/`val_split`/`test_split` name the source's
    splits (multi30k: 'test2016', hf: e.g. 'validation'); in the cache and the API they are
    always 'train'/'val'/'test'. `src_field`/`tgt_field`/`parent_field`: where the two sides
    are in TSV/JSONL/HF records.
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
    src_field: Optional[str] = None  # noqa: UP045 (default: src_lang)
    tgt_field: Optional[str] = None  # noqa: UP045 (default: tgt_lang)
    parent_field: Optional[str] = None  # noqa: UP045
    toy: ToyConfig = field(default_factory=ToyConfig)
    multi30k: Multi30kConfig = field(default_factory=Multi30kConfig)
    files: FilesConfig = field(default_factory=FilesConfig)
    hf: HFConfig = field(default_factory=HFConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    max_len: int = 128
    max_ratio: float = 3.0
    max_tokens: int = 4096
    # training deals each width's examples out to that width's batches afresh every epoch
    # (Sockeye's way); false: the same batches every epoch, in a new order (fairseq's)
    regroup: bool = False
    cache_dir: str = ".cache/aiayn"
    num_workers: int = 0
    # deprecated aliases (ALIASES): None unless given; applied to the new keys, then cleared
    toy_train_size: Optional[int] = None  # noqa: UP045
    toy_val_size: Optional[int] = None  # noqa: UP045
    toy_test_size: Optional[int] = None  # noqa: UP045
    toy_seed: Optional[int] = None  # noqa: UP045
    hf_name: Optional[str] = None  # noqa: UP045
    hf_config: Optional[str] = None  # noqa: UP045
    hf_revision: Optional[str] = None  # noqa: UP045
    # Any: OmegaConf cannot merge a mapping given on the command line into a None Dict node
    hf_data_files: Any = None
    download_url: Optional[str] = None  # noqa: UP045

    def __post_init__(self) -> None:
        for name, schema in (*SOURCE_SETTINGS.items(), ("tokenizer", TokenizerConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):  # DataConfig(**asdict(config)) builds them again
                setattr(self, name, schema(**value))
        self._apply_aliases()
        self.validate()

    def _apply_aliases(self) -> None:
        """Move each deprecated flat key that is set onto its new key, with a warning (none
        when it already holds that value, as in configs saved before the change). The alias
        wins over a preset's value (`data=hf data.hf_name=json`), as it did before the new
        keys; it is refused only where the new key was given too: on the command line in a
        Hydra job, else anywhere it is not at its default."""
        given = command_line_settings()
        for old, new in ALIASES.items():
            value = getattr(self, old)
            if value is None or value == {}:  # unset (hf_data_files' old default: {})
                setattr(self, old, None)
                continue
            owner, key = new.split(".")
            settings = getattr(self, owner)
            current = getattr(settings, key)
            default = {f.name: f for f in fields(settings)}[key]
            if given is not None:
                untouched = f"data.{new}" not in given
            else:
                untouched = current == (
                    default.default_factory()
                    if callable(default.default_factory)
                    else default.default
                )
            if value != current and not untouched:
                raise ValueError(
                    f"data.{old}={value!r} (deprecated) and data.{new}={current!r} disagree: "
                    f"give data.{new}={value!r} instead of data.{old}"
                )
            if value != current:
                log.warning("data.%s is deprecated: use data.%s (applied: %r)", old, new, value)
                setattr(settings, key, value)
            setattr(self, old, None)

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
