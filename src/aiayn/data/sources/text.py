"""Readers and the fingerprint shared by the file-based sources.

Fingerprint of a file: its content (size and SHA-256) up to `CONTENT_BYTES`, so that a file
rewritten with the same bytes (a copy, a checkout, every rank of a run writing the same
tokenizer) keeps its data cache; above it (WMT-size corpora), (resolved path, size, mtime,
ctime, inode), as git's index keys files: a `stat`, so a cache hit reads no big file, and any
write changes it (ctime cannot be restored by `cp -p`, `rsync -t` or `touch -d`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO

from aiayn.errors import DataError

CONTENT_BYTES = 64 << 20  # files up to this size are keyed by their content
# a longer line is cut here as it is read (far more tokens than any max_len), so one huge
# line is never held whole: training then drops it by its length, val/test truncate it
MAX_LINE_BYTES = 1 << 20


def file_fingerprint(path: Path) -> list[object]:
    """[size, SHA-256] of an existing file up to `CONTENT_BYTES`, else [resolved path, size,
    mtime_ns, ctime_ns, inode] (DataError if missing)."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    stat = path.stat()
    identity = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if stat.st_size <= CONTENT_BYTES:
        return [stat.st_size, _sha256(*identity)]
    return list(identity)


@functools.lru_cache(maxsize=256)
def _sha256(path: str, *stat: int) -> str:
    """SHA-256 of the file at `path`, once per process for each `stat` of it (a run keys its
    cache more than once)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def iter_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file (split on '\\n' only, trailing '\\r' dropped, a leading byte-order
    mark that some editors write dropped), one at a time."""
    if not path.is_file():
        raise DataError(f"input file {path} not found: check the data config's paths")
    with path.open("rb") as file:
        for number, raw in enumerate(bounded_lines(file), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}, line {number}: bytes that are not UTF-8 ({error.reason}); "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from error
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield line.removesuffix("\n").removesuffix("\r")


def bounded_lines(file: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary `file` (each with its newline, as iterating it gives), a line
    longer than `limit` bytes cut to its first `limit` bytes (at a UTF-8 character boundary,
    then a newline) while the rest is read and dropped in blocks: memory stays bounded."""
    while raw := file.readline(limit + 1):
        if len(raw) > limit and not raw.endswith(b"\n"):
            while (rest := file.readline(limit)) and not rest.endswith(b"\n"):
                pass
            raw = raw[:limit]
            while raw and raw[-1] & 0xC0 == 0x80:  # a character cut in its continuation
                raw = raw[:-1]
            if raw and raw[-1] >= 0xC0:  # ... or after its lead byte
                raw = raw[:-1]
            raw += b"\n"
        yield raw


def columns(pairs: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(source texts, target texts) of (source, target) pairs."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in pairs:
        src.append(s)
        tgt.append(t)
    return src, tgt


def iter_aligned(src_path: Path, tgt_path: Path, role: str) -> Iterator[tuple[str, str]]:
    """(source line, target line) of two files, which must have as many lines as each other."""
    for s, t in zip_longest(iter_lines(src_path), iter_lines(tgt_path)):
        if s is None or t is None:
            counts = [sum(1 for _ in iter_lines(path)) for path in (src_path, tgt_path)]
            raise DataError(
                f"{role} split: {src_path} has {counts[0]} lines but {tgt_path} has "
                f"{counts[1]}; source and target files must be line-aligned"
            )
        yield s, t


def iter_tsv(path: Path, fields: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """The (src, tgt) columns named `fields` in the header row of a TSV file, row by row."""
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise DataError(f"{path} is empty: a TSV needs a header row naming {fields}")
    header = first.split("\t")
    missing = [name for name in fields if name not in header]
    if missing:
        raise DataError(f"{path}: header {header} lacks column(s) {missing}")
    src_column, tgt_column = (header.index(name) for name in fields)
    for number, line in enumerate(lines, start=2):
        cells = line.split("\t")
        if len(cells) != len(header):
            raise DataError(
                f"{path}, line {number}: {len(cells)} columns, header has {len(header)}"
            )
        yield cells[src_column], cells[tgt_column]


def record_fields(record: object, fields: tuple[str, str], parent: str | None) -> tuple[str, str]:
    """The (src, tgt) strings of one record; KeyError/TypeError when they are missing."""
    inner = record[parent] if parent else record  # type: ignore[index]
    src, tgt = inner[fields[0]], inner[fields[1]]  # type: ignore[index]
    if not isinstance(src, str) or not isinstance(tgt, str):
        raise TypeError(f"fields {fields} must hold strings")
    return src, tgt


def iter_jsonl(
    path: Path, fields: tuple[str, str], parent: str | None
) -> Iterator[tuple[str, str]]:
    """The (src, tgt) string fields `fields` of each JSON line, under key `parent` if set
    (a blank line, such as a last empty one, holds no record and is skipped)."""
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        try:
            yield record_fields(json.loads(line), fields, parent)
        except (ValueError, KeyError, TypeError) as error:
            where = f"{parent}.{fields}" if parent else f"{fields}"
            raise DataError(f"{path}, line {number}: no string fields {where} ({error})") from error
