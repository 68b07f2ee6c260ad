"""The Hugging Face datasets source."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from aiayn.data.sources.base import Source
from aiayn.data.sources.text import file_fingerprint, record_fields
from aiayn.errors import DataError

if TYPE_CHECKING:
    from aiayn.data.config import DataConfig


@dataclass
class HFConfig:
    """`data.hf.*`: the dataset `name` (e.g. wmt14, or a builder such as json), its `config`
    (e.g. de-en) and `revision`, and local `data_files` (split -> path) for a builder."""

    name: Optional[str] = None  # noqa: UP045
    config: Optional[str] = None  # noqa: UP045
    revision: Optional[str] = None  # noqa: UP045
    # None: none; a whole mapping on the command line: data.hf.data_files="{train: a.jsonl}"
    data_files: Any = None  # {split: path}


class HFSource(Source):
    """A Hugging Face dataset `hf.name` (config `hf.config`, revision `hf.revision`) from the
    hub, or a builder such as 'json' on local `hf.data_files` (split -> path). Split names from
    `train_split`/`val_split`/`test_split` (e.g. 'validation'); records hold the fields
    `src_field`/`tgt_field` (default: the languages), optionally under `parent_field` (e.g.
    'translation'). Fingerprinted by those settings and a `stat` of each local data file."""

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        self._loaded: dict[str, Any] = {}  # split name -> datasets.Dataset

    def validate(self) -> None:
        if not self.cfg.hf.name:
            raise ValueError("DataConfig.hf.name must name a dataset (e.g. wmt14) for source=hf")
        files = self.cfg.hf.data_files
        if files is not None and not (
            isinstance(files, dict) and all(isinstance(v, str) for v in files.values())
        ):
            raise ValueError(
                "DataConfig.hf.data_files must map split names to paths, e.g. "
                f'data.hf.data_files="{{train: train.jsonl}}", got {files!r}'
            )

    def fingerprint(self) -> dict[str, object]:
        cfg = self.cfg
        local = {
            split: file_fingerprint(Path(path)) if Path(path).is_file() else path
            for split, path in sorted((cfg.hf.data_files or {}).items())
        }
        return {
            "hf": [cfg.hf.name, cfg.hf.config, cfg.hf.revision, cfg.split_names, cfg.fields],
            "data_files": local,
        }

    def pairs(self, role: str) -> Iterator[tuple[str, str]]:
        """The split's pairs, streamed from the dataset's memory-mapped Arrow files (loaded
        once per source object)."""
        dataset, split = self._load(role), self.cfg.split_names[role]
        src_field, tgt_field = self.cfg.fields
        columns = [self.cfg.parent_field] if self.cfg.parent_field else [src_field, tgt_field]
        missing = [name for name in columns if name not in dataset.column_names]
        if missing:
            raise DataError(
                f"dataset {self.cfg.hf.name!r} split {split!r} has columns "
                f"{dataset.column_names}, not {missing}: set data.parent_field / "
                "data.src_field / data.tgt_field"
            )
        return self._records(dataset, split, columns)

    def _records(self, dataset: Any, split: str, columns: list[str]) -> Iterator[tuple[str, str]]:
        cfg, number = self.cfg, 0
        for rows in dataset.select_columns(columns).iter(batch_size=10_000):
            for i in range(len(rows[columns[0]])):
                record = {column: rows[column][i] for column in columns}
                try:
                    pair = record_fields(record, cfg.fields, cfg.parent_field)
                except (KeyError, TypeError) as error:
                    raise DataError(f"{cfg.hf.name!r} {split} record {number}: {error}") from error
                yield pair
                number += 1

    def _load(self, role: str) -> Any:
        import datasets  # slow to import; only this source needs it

        cfg = self.cfg
        split = cfg.split_names[role]
        if split not in self._loaded:
            try:
                self._loaded[split] = datasets.load_dataset(
                    cfg.hf.name,
                    cfg.hf.config,
                    data_files=dict(cfg.hf.data_files or {}) or None,
                    revision=cfg.hf.revision,
                    split=split,
                    cache_dir=str(Path(cfg.cache_dir) / "hf"),
                )
            except Exception as error:  # datasets/hub raise many types (files, network, ...)
                raise DataError(
                    f"cannot load Hugging Face dataset {cfg.hf.name!r} split {split!r}: {error}"
                ) from error
        return self._loaded[split]
