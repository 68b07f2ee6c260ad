"""The 'files' source: your own corpus on local files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import List  # noqa: UP035 (OmegaConf)

from aiayn.data.checks import ROLES
from aiayn.data.sources.base import FileSource
from aiayn.data.sources.text import iter_aligned, iter_jsonl, iter_tsv
from aiayn.errors import DataError


@dataclass
class FilesConfig:
    """`data.files.*`: per split, [source text, target text] (line-aligned) or [one .tsv or
    .jsonl file]."""

    train: List[str] = field(default_factory=list)  # noqa: UP006
    val: List[str] = field(default_factory=list)  # noqa: UP006
    test: List[str] = field(default_factory=list)  # noqa: UP006


class FilesSource(FileSource):
    """Your own files: `files` maps each role to [src, tgt] line-aligned text files, or to
    [one .tsv with a header row / one .jsonl] with fields `src_field`/`tgt_field` (default:
    the languages), optionally under `parent_field`. Relative paths are resolved against
    `root` when it is set."""

    def validate(self) -> None:
        for role in ROLES:
            paths = getattr(self.cfg.files, role)
            if len(paths) not in (1, 2):
                raise ValueError(
                    f"DataConfig.files.{role} must list 2 text files or 1 .tsv/.jsonl "
                    f"file, got {list(paths)}"
                )

    def files(self) -> dict[str, list[Path]]:
        root = Path(self.cfg.root) if self.cfg.root else Path()
        return {role: [root / path for path in getattr(self.cfg.files, role)] for role in ROLES}

    def pairs(self, role: str) -> Iterator[tuple[str, str]]:
        paths = self.files()[role]
        if len(paths) == 2:
            return iter_aligned(paths[0], paths[1], role)
        path = paths[0]
        if path.suffix == ".tsv":
            return iter_tsv(path, self.cfg.fields)
        if path.suffix == ".jsonl":
            return iter_jsonl(path, self.cfg.fields, self.cfg.parent_field)
        raise DataError(f"{path}: a single file per split must end in .tsv or .jsonl")
