"""Readers: each source's splits as (source texts, target texts), and a cheap fingerprint of
the inputs for the cache key.

Fingerprint of a file: (resolved path, size, mtime, ctime, inode), as git's index keys files:
a `stat`, so a cache hit reads no file even on WMT-size corpora, and any write changes it
(ctime cannot be restored by `cp -p`, `rsync -t` or `touch -d`). The toy corpus is
fingerprinted by its settings; a Hugging Face dataset by its name, config, revision, split
names and local data files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aiayn.data.config import ROLES, DataConfig
from aiayn.data.errors import DataError
from aiayn.data.toy import write_toy_corpus

TOY_VERSION = 1  # bump when the toy grammar changes


def file_fingerprint(path: Path) -> list[object]:
    """[resolved path, size, mtime_ns, ctime_ns, inode] of an existing file (DataError if
    missing)."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def _toy_dir(cfg: DataConfig) -> Path:
    sizes = f"{cfg.toy_train_size}-{cfg.toy_val_size}-{cfg.toy_test_size}"
    return Path(cfg.cache_dir) / f"toy-v{TOY_VERSION}-{sizes}-seed{cfg.toy_seed}"


def _toy_files(cfg: DataConfig) -> dict[str, list[Path]]:
    """Generate the toy corpus into the cache once (temp dir + atomic rename)."""
    directory = _toy_dir(cfg)
    langs = (cfg.src_lang, cfg.tgt_lang)
    if sorted(langs) != ["de", "en"]:
        raise DataError(f"the toy corpus is en<->de; got src_lang/tgt_lang {langs}")
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = directory.with_name(f".{directory.name}.{os.getpid()}")
        tmp.mkdir(exist_ok=True)
        sizes = {"train": cfg.toy_train_size, "val": cfg.toy_val_size, "test": cfg.toy_test_size}
        write_toy_corpus(tmp, sizes, cfg.toy_seed)
        try:
            tmp.rename(directory)
        except OSError:  # another process won the race: its copy is identical
            for file in tmp.iterdir():
                file.unlink()
            tmp.rmdir()
    return {role: [directory / f"{role}.{lang}" for lang in langs] for role in ROLES}


def split_files(cfg: DataConfig) -> dict[str, list[Path]]:
    """Role -> the files holding that split ([src, tgt] text, or [one .tsv/.jsonl])."""
    if cfg.source == "toy":
        return _toy_files(cfg)
    if cfg.source == "multi30k":
        root = Path(cfg.root or "")
        names = cfg.split_names
        langs = (cfg.src_lang, cfg.tgt_lang)
        return {role: [root / f"{names[role]}.{lang}" for lang in langs] for role in ROLES}
    root = Path(cfg.root) if cfg.root else Path()
    return {role: [root / path for path in cfg.files[role]] for role in ROLES}


def fingerprint(cfg: DataConfig) -> dict[str, object]:
    """What identifies the inputs (see the module docstring); cheap, reads no file."""
    if cfg.source == "toy":
        sizes = [cfg.toy_train_size, cfg.toy_val_size, cfg.toy_test_size]
        return {"toy": [TOY_VERSION, sizes, cfg.toy_seed]}
    if cfg.source == "hf":
        local = {
            split: file_fingerprint(Path(path)) if Path(path).is_file() else path
            for split, path in sorted(cfg.hf_data_files.items())
        }
        return {
            "hf": [cfg.hf_name, cfg.hf_config, cfg.hf_revision, cfg.split_names, cfg.fields],
            "data_files": local,
        }
    files = split_files(cfg)
    return {role: [file_fingerprint(path) for path in paths] for role, paths in files.items()}


def read_split(cfg: DataConfig, role: str) -> tuple[list[str], list[str]]:
    """(source texts, target texts) of split `role`, line-aligned, original text."""
    if cfg.source == "hf":
        return _read_hf(cfg, role)
    paths = split_files(cfg)[role]
    if len(paths) == 2:
        src, tgt = (_read_lines(path) for path in paths)
        if len(src) != len(tgt):
            raise DataError(
                f"{role} split: {paths[0]} has {len(src)} lines but {paths[1]} has "
                f"{len(tgt)}; source and target files must be line-aligned"
            )
        return src, tgt
    path = paths[0]
    if path.suffix == ".tsv":
        return _read_tsv(path, cfg.fields)
    if path.suffix == ".jsonl":
        return _read_jsonl(path, cfg.fields, cfg.parent_field)
    raise DataError(f"{path}: a single file per split must end in .tsv or .jsonl")


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file (split on '\\n' only, trailing '\\r' dropped)."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{path}, line {line}: bytes that are not UTF-8 ({error.reason}); re-encode the "
            f"file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from error
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _read_tsv(path: Path, fields: tuple[str, str]) -> tuple[list[str], list[str]]:
    lines = _read_lines(path)
    if not lines:
        raise DataError(f"{path} is empty: a TSV needs a header row naming {fields}")
    header = lines[0].split("\t")
    missing = [name for name in fields if name not in header]
    if missing:
        raise DataError(f"{path}: header {header} lacks column(s) {missing}")
    columns = [header.index(name) for name in fields]
    src, tgt = [], []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) != len(header):
            raise DataError(
                f"{path}, line {number}: {len(cells)} columns, header has {len(header)}"
            )
        src.append(cells[columns[0]])
        tgt.append(cells[columns[1]])
    return src, tgt


def _fields_of(record: object, fields: tuple[str, str], parent: str | None) -> tuple[str, str]:
    """The (src, tgt) strings of one record; KeyError/TypeError when they are missing."""
    inner = record[parent] if parent else record  # type: ignore[index]
    src, tgt = inner[fields[0]], inner[fields[1]]  # type: ignore[index]
    if not isinstance(src, str) or not isinstance(tgt, str):
        raise TypeError(f"fields {fields} must hold strings")
    return src, tgt


def _read_jsonl(
    path: Path, fields: tuple[str, str], parent: str | None
) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for number, line in enumerate(_read_lines(path), start=1):
        try:
            s, t = _fields_of(json.loads(line), fields, parent)
        except (ValueError, KeyError, TypeError) as error:
            where = f"{parent}.{fields}" if parent else f"{fields}"
            raise DataError(f"{path}, line {number}: no string fields {where} ({error})") from error
        src.append(s)
        tgt.append(t)
    return src, tgt


def _read_hf(cfg: DataConfig, role: str) -> tuple[list[str], list[str]]:
    """One split of a Hugging Face dataset (hub, or a builder such as 'json' on local files)."""
    import datasets

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
            s, t = _fields_of(record, cfg.fields, None)
        except (KeyError, TypeError) as error:
            raise DataError(f"{cfg.hf_name!r} {split} record {number}: {error}") from error
        src.append(s)
        tgt.append(t)
    return src, tgt
