"""Small generated corpora and configs for the data tests (no network, tmp dirs only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.data.config import DataConfig, TokenizerConfig
from aiayn.data.toy import generate_pairs

SIZES = {"train": 300, "val": 30, "test": 30}


def write_parallel(directory: Path, sizes: dict[str, int] = SIZES, seed: int = 0) -> None:
    """`{split}.en` / `{split}.de` toy text files with the given number of lines."""
    pairs = iter(generate_pairs(sum(sizes.values()), seed))
    for split, size in sizes.items():
        chunk = [next(pairs) for _ in range(size)]
        for lang, side in (("en", 0), ("de", 1)):
            lines = "".join(pair[side] + "\n" for pair in chunk)
            (directory / f"{split}.{lang}").write_text(lines, encoding="utf-8")


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """A directory with line-aligned toy splits train/val/test (.en, .de)."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    write_parallel(directory)
    return directory


def small_config(tmp_path: Path, vocab_size: int, **settings: object) -> DataConfig:
    """A DataConfig for tests: a small tokenizer, short sentences and batches, the cache
    under tmp_path, and `settings` on top."""
    defaults: dict[str, object] = {
        "tokenizer": TokenizerConfig(vocab_size=vocab_size, min_frequency=1),
        "max_len": 32,
        "max_tokens": 256,
        "cache_dir": str(tmp_path / "cache"),
    }
    return DataConfig(**{**defaults, **settings})  # type: ignore[arg-type]


@pytest.fixture
def files_cfg(corpus_dir: Path, tmp_path: Path) -> Callable[..., DataConfig]:
    """make(**overrides) -> a 'files' DataConfig over corpus_dir with a small tokenizer."""

    def make(**overrides: object) -> DataConfig:
        files = {role: [f"{role}.en", f"{role}.de"] for role in SIZES}
        settings = {"source": "files", "root": str(corpus_dir), "files": files}
        return small_config(tmp_path, 300, **{**settings, **overrides})

    return make
