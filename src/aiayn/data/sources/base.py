"""`Source`: one kind of corpus (`DataConfig.source`), and `FileSource` for those on local files.

A source streams the train/val/test splits as (source text, target text) pairs (a WMT-size
corpus is read more than once, never held whole) and fingerprints its inputs for the cache
key. In the cache and the API the splits are always the roles
'train'/'val'/'test'; `DataConfig.split_names` maps them to the source's own split names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.data.sources.text import columns, file_fingerprint, iter_aligned

if TYPE_CHECKING:
    from aiayn.data.config import DataConfig


class Source(ABC):
    """A corpus configured by a `DataConfig`; registered by name in `aiayn.data.sources`."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def validate(self) -> None:
        """Raise ValueError naming the `DataConfig.<field>` this source needs and what to do."""

    @abstractmethod
    def pairs(self, role: str) -> Iterator[tuple[str, str]]:
        """The (source text, target text) pairs of split `role`, original text, streamed (a
        new iterator per call, reading from the start)."""

    def read(self, role: str) -> tuple[list[str], list[str]]:
        """(source texts, target texts) of split `role`, aligned, in memory."""
        return columns(self.pairs(role))

    @abstractmethod
    def fingerprint(self) -> dict[str, object]:
        """What identifies the inputs, for the cache key; cheap: reads no file."""


class FileSource(Source):
    """A source whose splits are [source, target] line-aligned local text files, fingerprinted
    by a `stat` of each (see `text.file_fingerprint`)."""

    @abstractmethod
    def files(self) -> dict[str, list[Path]]:
        """Role -> the files holding that split."""

    def pairs(self, role: str) -> Iterator[tuple[str, str]]:
        src_path, tgt_path = self.files()[role]
        return iter_aligned(src_path, tgt_path, role)

    def fingerprint(self) -> dict[str, object]:
        files = self.files()
        return {role: [file_fingerprint(path) for path in paths] for role, paths in files.items()}
