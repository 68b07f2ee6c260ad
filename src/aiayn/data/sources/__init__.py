"""Corpus sources: `DataConfig.source` names one of `SOURCES`, a `Source` class that reads the
train/val/test splits and fingerprints its inputs (each class's docstring says what it reads).

A new corpus: a module here with a `Source` subclass, its entry in `SOURCES`, and a YAML file
in `conf/data/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.data.sources.base import FileSource, Source
from aiayn.data.sources.files import FilesSource
from aiayn.data.sources.hf import HFSource
from aiayn.data.sources.multi30k import Multi30kSource
from aiayn.data.sources.toy import ToySource

if TYPE_CHECKING:
    from aiayn.data.config import DataConfig

SOURCES: dict[str, type[Source]] = {
    "toy": ToySource,
    "multi30k": Multi30kSource,
    "files": FilesSource,
    "hf": HFSource,
}

__all__ = ["SOURCES", "FileSource", "Source", "get_source", "local_files", "read_split"]


def get_source(cfg: DataConfig) -> Source:
    """The source `cfg.source` names, configured by cfg (ValueError naming the known ones)."""
    if cfg.source not in SOURCES:
        raise ValueError(f"DataConfig.source must be one of {tuple(SOURCES)}, got {cfg.source!r}")
    return SOURCES[cfg.source](cfg)


def local_files(corpus: Source) -> list[Path]:
    """The local files of `corpus` (none for a generated or downloaded-by-name one): inputs no
    command may write over."""
    if not isinstance(corpus, FileSource):
        return []
    return [path for paths in corpus.files().values() for path in paths]


def read_split(cfg: DataConfig, role: str) -> tuple[list[str], list[str]]:
    """(source texts, target texts) of split `role` ('train'/'val'/'test'), original text."""
    return get_source(cfg).read(role)
