"""The Hugging Face datasets source."""

from __future__ import annotations

from pathlib import Path

from aiayn.data.sources.base import Source
from aiayn.data.sources.text import file_fingerprint, record_fields
from aiayn.errors import DataError


class HFSource(Source):
    """A Hugging Face dataset `hf_name` (config `hf_config`, revision `hf_revision`) from the
    hub, or a builder such as 'json' on local `hf_data_files` (split -> path). Split names from
    `train_split`/`val_split`/`test_split` (e.g. 'validation'); records hold the fields
    `src_field`/`tgt_field` (default: the languages), optionally under `parent_field` (e.g.
    'translation'). Fingerprinted by those settings and a `stat` of each local data file."""

    def validate(self) -> None:
        if not self.cfg.hf_name:
            raise ValueError("DataConfig.hf_name must name a dataset (e.g. wmt14) for source=hf")

    def fingerprint(self) -> dict[str, object]:
        cfg = self.cfg
        local = {
            split: file_fingerprint(Path(path)) if Path(path).is_file() else path
            for split, path in sorted(cfg.hf_data_files.items())
        }
        return {
            "hf": [cfg.hf_name, cfg.hf_config, cfg.hf_revision, cfg.split_names, cfg.fields],
            "data_files": local,
        }

    def read(self, role: str) -> tuple[list[str], list[str]]:
        import datasets  # slow to import; only this source needs it

        cfg = self.cfg
        split = cfg.split_names[role]
        try:
            dataset = datasets.load_dataset(
                cfg.hf_name,
                cfg.hf_config,
                data_files=dict(cfg.hf_data_files) or None,
                revision=cfg.hf_revision,
                split=split,
                cache_dir=str(Path(cfg.cache_dir) / "hf"),
            )
        except Exception as error:  # datasets/hub raise many types (files, network, formats)
            raise DataError(
                f"cannot load Hugging Face dataset {cfg.hf_name!r} split {split!r}: {error}"
            ) from error
        src_field, tgt_field = cfg.fields
        columns = [cfg.parent_field] if cfg.parent_field else [src_field, tgt_field]
        missing = [name for name in columns if name not in dataset.column_names]
        if missing:
            raise DataError(
                f"dataset {cfg.hf_name!r} split {split!r} has columns {dataset.column_names}, "
                f"not {missing}: set data.parent_field / data.src_field / data.tgt_field"
            )
        if not cfg.parent_field:
            return list(dataset[src_field]), list(dataset[tgt_field])
        src, tgt = [], []
        for number, record in enumerate(dataset[cfg.parent_field]):
            try:
                s, t = record_fields(record, cfg.fields, None)
            except (KeyError, TypeError) as error:
                raise DataError(f"{cfg.hf_name!r} {split} record {number}: {error}") from error
            src.append(s)
            tgt.append(t)
        return src, tgt
