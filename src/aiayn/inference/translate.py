"""`python translate.py ckpt_path=... input=<file|-> output=<file|->` (conf/translate.yaml).

Output is written and flushed batch by batch, so an error never loses what was already
translated; input is read as bytes and decoded line by line, so invalid UTF-8 is named by its
line. Decode settings: the checkpoint's `decode` hyper-parameters, with the `decode` keys of
the config on top (`decode=beam`, `decode.beam_size=8`).

With `decode.nbest` N > 1 each input line gives N output lines, best first, in the Moses
n-best format `<input line, from 0> ||| <translation> ||| <score>` (the score is the
length-normalised log-probability the beam ranks by; a blank input line gives one entry with
an empty translation and score 0). With N = 1 the output is one plain translation per line.

`decode.prefix=<text>` forces every output to start with that text; `prefix_file=<file>`
gives one prefix per input line (its lines must match the input's one to one; a blank one
forces nothing). The prefix is tokenized with the target tokenizer, so a lowercasing model's
output starts with the lowercased prefix.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TextIO

from omegaconf import DictConfig

from aiayn.console import Advance, progress
from aiayn.data.sources import get_source, local_files
from aiayn.data.sources.text import bounded_lines
from aiayn.errors import ConfigError, TranslationError, writing
from aiayn.inference.checkpoint import run_data_config
from aiayn.inference.config import TranslateConfig
from aiayn.inference.ct2 import load_translator
from aiayn.inference.translator import LongLineError, Translator
from aiayn.outputs import check_output
from aiayn.schema import to_schema

log = logging.getLogger(__name__)


def translate_stream(
    translator: Translator,
    lines: Iterable[str | bytes],
    out: TextIO,
    batch_size: int,
    source: str,
    prefixes: Iterable[str | bytes] | None = None,
    prefix_source: str = "<prefixes>",
    advance: Advance | None = None,
) -> int:
    """Translate `lines` batch by batch, writing and flushing each batch's translations to
    `out` (one per line, newline-terminated); returns the number of lines. `prefixes` (one
    per line of `lines`, from `prefix_source`) force the start of each translation;
    `advance(n)` is called after each batch of n lines."""
    batch: list[str] = []
    forced: list[str] | None = None if prefixes is None else []
    prefix_lines = None if prefixes is None else iter(prefixes)
    count = 0

    def flush() -> None:
        _write(out, translator, batch, count - len(batch) + 1, source, forced)
        if advance is not None:
            advance(len(batch))
        batch.clear()
        if forced is not None:
            forced.clear()

    for count, line in enumerate(lines, start=1):
        try:
            line = _text(line, source, count)
            if prefix_lines is not None and forced is not None:
                prefix = next(prefix_lines, None)
                if prefix is None:
                    raise TranslationError(
                        f"{prefix_source} has {count - 1} lines, {source} more: give one "
                        "prefix per input line (a blank one forces nothing)"
                    )
                forced.append(_text(prefix, prefix_source, count))
        except TranslationError as error:
            count -= 1
            if batch:  # what came before the bad line is translated and kept
                flush()
            message = f"{error}; the {count} lines before it were translated"
            raise TranslationError(message) from None
        batch.append(line)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    if prefix_lines is not None and next(prefix_lines, None) is not None:
        raise TranslationError(
            f"{prefix_source} has more lines than the {count} of {source} (all {count} were "
            "translated): give one prefix per input line"
        )
    return count


def _text(line: str | bytes, source: str, number: int) -> str:
    """`line` as text without its newline; bytes are decoded here, so an error names the
    line."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TranslationError(
                f"{source}:{number}: not valid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
    return line.rstrip("\r\n")


def _write(
    out: TextIO,
    translator: Translator,
    batch: list[str],
    first: int,
    source: str,
    prefixes: list[str] | None = None,
) -> None:
    try:
        nbest = translator.translate_nbest(batch, first, source, prefixes)
    except LongLineError as error:
        out.writelines(_format(error.done, first, translator.decode.nbest))
        out.flush()
        raise
    out.writelines(_format(nbest, first, translator.decode.nbest))
    out.flush()


def _format(nbest: list[list[tuple[str, float]]], first: int, n: int) -> Iterator[str]:
    """Plain lines (n = 1), or Moses n-best lines numbered from 0 (`first` is 1-based)."""
    for index, hyps in enumerate(nbest, start=first - 1):
        if n == 1:
            yield f"{hyps[0][0]}\n"
            continue
        for text, score in hyps:
            yield f"{index} ||| {text} ||| {score:.4f}\n"


@contextmanager
def _open(path: str, mode: str) -> Iterator[Any]:
    """Input as binary lines (decoded, and checked, line by line), output as text."""
    if path == "-":
        yield sys.stdin.buffer if mode == "r" else sys.stdout
        return
    if mode == "r" and not Path(path).is_file():
        raise TranslationError(f"input file {path} not found")
    if mode == "r":
        with open(path, "rb") as file:
            yield file
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as file:
        yield file


def _count_lines(path: str) -> int | None:
    """Lines of the file `path` (None if it cannot be read: opening it names the error)."""
    count, last = 0, b"\n"
    try:
        with open(path, "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                count, last = count + chunk.count(b"\n"), chunk[-1:]
    except OSError:
        return None
    return count + (last != b"\n")  # a last line without its newline


def _inputs(config: TranslateConfig) -> dict[str, Any]:
    """Every file translate reads, by its key, and the local corpus of the run that trained
    the checkpoint(s): what `output` must not be."""
    inputs = {"input": config.input, "prefix_file": config.prefix_file}
    inputs |= {"tokenizer": config.tokenizer, "ckpt_path": config.ckpt_path}
    return inputs | {"a file of ct2_path": config.ct2_path} | _run_corpus(config.ckpt_path)


def _run_corpus(ckpt_path: str | list[str] | None) -> dict[str, list[Path]]:
    """The local corpus files of the run(s) the checkpoint(s) came from, where their run
    config is beside them (translate itself needs no data config: where it cannot be read,
    nothing)."""
    files: list[Path] = []
    for path in [ckpt_path] if isinstance(ckpt_path, str) else ckpt_path or []:
        try:
            corpus = get_source(run_data_config(path))
        except (ConfigError, ValueError):
            continue
        files += local_files(corpus)
    return {"a file of the corpus its run trained on": files} if files else {}


def run(cfg: DictConfig | dict) -> int:
    """What `python translate.py` does; returns the number of lines translated."""
    config = to_schema(cfg, TranslateConfig)
    for key in ("input", "prefix_file"):  # before the output check, which lists a directory
        value = getattr(config, key)
        if value not in (None, "-") and Path(value).is_dir():
            raise TranslationError(f"{key} {value} is a directory: name a text file")
    check_output(config.output, "output", _inputs(config))
    loaded = load_translator(
        config.ckpt_path,
        config.device,
        config.tokenizer,
        config.engine,
        config.ct2_path,
        config.ct2_compute_type,
        config.ct2_inter_threads,
        config.ct2_intra_threads,
        config.dtype,
    )
    translator = loaded.with_settings(config.decode.given(), config.on_long)
    source = "<stdin>" if config.input == "-" else config.input
    prefix_file = config.prefix_file
    if prefix_file is not None and (prefix_file == "-" or not Path(prefix_file).is_file()):
        raise TranslationError(f"prefix_file {prefix_file} not found (a file is needed)")
    # a file's lines are counted first, for the bar's total (standard input has none)
    total = None if config.input == "-" else _count_lines(config.input)
    # a full disk (also when the output is closed, flushing its last bytes) is one line
    kept = f"; every line before the failed batch is in {config.output}"
    target = "/dev/stdout" if config.output == "-" else config.output
    with (
        writing(target, None, kept),
        _open(config.input, "r") as src,
        _open(config.output, "w") as out,
        _open(prefix_file, "r") if prefix_file else nullcontext() as prefixes,
        progress(config.progress and not src.isatty()) as bars,
        translator.decoding(),
    ):
        batch_size = 1 if src.isatty() else config.batch_size  # answer each typed line
        count = translate_stream(
            translator,
            src if src.isatty() else bounded_lines(src),
            out,
            batch_size,
            source,
            prefixes,
            prefix_file or "<prefixes>",
            bars.stage(f"translate {Path(source).name}", total),
        )
    log.info("translated %d lines from %s (decode: %s)", count, source, translator.decode)
    return count
