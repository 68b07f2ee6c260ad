"""Readers and the fingerprint shared by the file-based sources.

Fingerprint of a file: (resolved path, size, mtime, ctime, inode), as git's index keys files:
a `stat`, so a cache hit reads no file even on WMT-size corpora, and any write changes it
(ctime cannot be restored by `cp -p`, `rsync -t` or `touch -d`).
"""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.errors import DataError


def file_fingerprint(path: Path) -> list[object]:
    """[resolved path, size, mtime_ns, ctime_ns, inode] of an existing file (DataError if
    missing)."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file (split on '\\n' only, trailing '\\r' dropped), read a line at a
    time: memory is the lines' own, not two more copies of the file."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    lines = []
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}, line {number}: bytes that are not UTF-8 ({error.reason}); "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from error
            lines.append(line.removesuffix("\n").removesuffix("\r"))
    return lines


def read_aligned(src_path: Path, tgt_path: Path, role: str) -> tuple[list[str], list[str]]:
    """The lines of a source and a target file, which must have as many lines as each other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{role} split: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            f"source and target files must be line-aligned"
        )
    return src, tgt


def read_tsv(path: Path, fields: tuple[str, str]) -> tuple[list[str], list[str]]:
    """The (src, tgt) columns named `fields` in the header row of a TSV file."""
    lines = read_lines(path)
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


def record_fields(record: object, fields: tuple[str, str], parent: str | None) -> tuple[str, str]:
    """The (src, tgt) strings of one record; KeyError/TypeError when they are missing."""
    inner = record[parent] if parent else record  # type: ignore[index]
    src, tgt = inner[fields[0]], inner[fields[1]]  # type: ignore[index]
    if not isinstance(src, str) or not isinstance(tgt, str):
        raise TypeError(f"fields {fields} must hold strings")
    return src, tgt


def read_jsonl(
    path: Path, fields: tuple[str, str], parent: str | None
) -> tuple[list[str], list[str]]:
    """The (src, tgt) string fields `fields` of each JSON line, under key `parent` if set."""
    src, tgt = [], []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            s, t = record_fields(json.loads(line), fields, parent)
        except (ValueError, KeyError, TypeError) as error:
            where = f"{parent}.{fields}" if parent else f"{fields}"
            raise DataError(f"{path}, line {number}: no string fields {where} ({error})") from error
        src.append(s)
        tgt.append(t)
    return src, tgt
