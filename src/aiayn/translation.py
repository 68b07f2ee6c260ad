"""Translate raw text lines with a checkpoint: load, tokenize, decode in batches, detokenize.

`python translate.py ckpt_path=... input=<file|-> output=<file|->` (conf/translate.yaml) calls
`run`. Sources are laid out exactly as in training (`x + <eos>`, see
`aiayn.data.dataset.collate_sources`). An empty (or blank) line translates to an empty line
without touching the model, so output line i always belongs to input line i. A line longer
than the model's positions (`max_positions - 1` tokens, room for `<eos>`) is truncated with a
warning naming its file and line (`on_long: truncate`) or stops the run with that message
(`on_long: fail`) after the lines before it have been written. Output is written and flushed
batch by batch, so an error never loses what was already translated.

Decode settings: the checkpoint's `decode` hyper-parameters, with any keys given in the
`decode` node on top (`decode=beam` selects conf/decode/beam.yaml; `+decode.beam_size=8`
changes one key of the checkpoint's settings).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, TextIO

import torch
from omegaconf import DictConfig

from aiayn.config import ConfigError, PathsConfig, to_schema
from aiayn.data.dataset import collate_sources
from aiayn.data.errors import DataError
from aiayn.data.tokenizer import Tokenizers
from aiayn.lit_module import TranslationModule
from aiayn.model import DecodeConfig

log = logging.getLogger(__name__)

ON_LONG = ("truncate", "fail")


class TranslationError(ValueError):
    """A checkpoint, tokenizer or input line that cannot be translated; names the file (and
    line) and what to do."""


class LongLineError(TranslationError):
    """A line over the length limit with `on_long: fail`; `done` holds the translations of
    the lines before it (for the caller to write before stopping)."""

    def __init__(self, message: str, done: list[str]) -> None:
        super().__init__(message)
        self.done = done


@dataclass
class TranslateConfig:
    """Everything `python translate.py` reads (conf/translate.yaml)."""

    ckpt_path: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    input: str = "-"  # a text file, or '-' for standard input
    output: str = "-"  # a text file, or '-' for standard output
    decode: dict[str, Any] = field(default_factory=dict)  # on top of the checkpoint's
    tokenizer: Optional[str] = None  # noqa: UP045 (default: the checkpoint's own)
    batch_size: int = 32  # lines per batch (1 when reading a terminal)
    on_long: str = "truncate"
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda:1', ...
    paths: PathsConfig = field(default_factory=PathsConfig)
    task_name: str = "translate"

    def __post_init__(self) -> None:
        check_common(self.ckpt_path, self.batch_size, self.on_long)


def check_common(ckpt_path: str | None, batch_size: int, on_long: str) -> None:
    """The checks `translate` and `evaluate` share; ConfigError names the key."""
    if not ckpt_path:
        raise ConfigError(
            "ckpt_path is required: ckpt_path=logs/train/runs/<ts>/checkpoints/best.ckpt"
        )
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size}")
    if on_long not in ON_LONG:
        raise ConfigError(f"on_long must be one of {ON_LONG}, got {on_long!r}")


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda if available, else cpu; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_checkpoint(
    ckpt_path: str | Path, device: str = "auto", tokenizer: str | None = None
) -> TranslationModule:
    """The module of a checkpoint in eval mode on `device`, with a tokenizer that fits it.

    `tokenizer` (a tokenizer.json or a directory written by `Tokenizers.save`) replaces the
    checkpoint's own. Raises TranslationError for a missing or unreadable checkpoint, no
    tokenizer, or a tokenizer whose vocabulary size differs from the model's.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise TranslationError(
            f"checkpoint {path} not found: give ckpt_path=<run dir>/checkpoints/best.ckpt"
        )
    try:
        module = TranslationModule.load_from_checkpoint(path, map_location=resolve_device(device))
    except Exception as error:  # torch/lightning raise many types for foreign or broken files
        raise TranslationError(
            f"cannot load checkpoint {path} ({type(error).__name__}: {error}); is it a "
            "checkpoint written by `python train.py` (or aiayn.averaging)?"
        ) from error
    if tokenizer is not None:
        try:
            given = Tokenizers.load(tokenizer)
        except DataError as error:
            raise TranslationError(str(error)) from error
        if module.tokenizers is not None and given.state() != module.tokenizers.state():
            raise TranslationError(
                f"tokenizer {tokenizer} differs from the one checkpoint {path} was trained "
                "with (which it carries): drop tokenizer=... to use that one"
            )
        module.tokenizers = given
    if module.tokenizers is None:
        raise TranslationError(
            f"checkpoint {path} carries no tokenizer: pass tokenizer=<run dir>/tokenizer.json"
        )
    _check_vocab(module, tokenizer or str(path))
    return module.eval()


def _check_vocab(module: TranslationModule, origin: str) -> None:
    tokenizers, config = module.tokenizers, module.model_config
    assert tokenizers is not None
    for side, have, want in (
        ("src", tokenizers.src_vocab_size, config.src_vocab_size),
        ("tgt", tokenizers.tgt_vocab_size, config.tgt_vocab_size),
    ):
        if have != want:
            raise TranslationError(
                f"tokenizer from {origin} has a {side} vocabulary of {have} tokens but the "
                f"model expects {want}: use the tokenizer.json of the run that wrote the "
                "checkpoint"
            )


def decode_config(base: DecodeConfig, overrides: dict[str, Any]) -> DecodeConfig:
    """`base` (the checkpoint's settings) with `overrides` on top; ConfigError names the key."""
    try:
        return to_schema({**asdict(base), **overrides}, DecodeConfig)
    except ConfigError as error:
        raise ConfigError(f"decode: {error}") from None


class Translator:
    """Raw source lines -> translated lines with one loaded module, on its device.

    `max_src_tokens = max_positions - 1` (the source gets `<eos>` appended).
    """

    def __init__(
        self, module: TranslationModule, decode: DecodeConfig, on_long: str = "truncate"
    ) -> None:
        assert module.tokenizers is not None, "use load_checkpoint (it checks the tokenizer)"
        self.module, self.decode, self.on_long = module, decode, on_long
        self.tokenizers: Tokenizers = module.tokenizers
        self.max_src_tokens = module.model_config.max_positions - 1

    def translate(
        self, lines: list[str], first_line: int = 1, source: str = "<input>"
    ) -> list[str]:
        """One translation per line, in order ('' for a blank line); `first_line` and `source`
        only name lines in messages. Raises LongLineError (with the translations of the lines
        before it) for an over-long line when `on_long='fail'`."""
        ids = self.tokenizers.encode(lines, side="src")
        for i, row in enumerate(ids):
            try:
                ids[i] = self._fit(row, f"{source}:{first_line + i}")
            except TranslationError as error:
                done = self._decode(lines[:i], ids[:i])  # rows before i are already fitted
                raise LongLineError(str(error), done) from None
        return self._decode(lines, ids)

    def translate_all(
        self, lines: list[str], batch_size: int, source: str = "<input>"
    ) -> list[str]:
        """Translate a whole corpus in length-sorted batches (less padding), in input order.
        Over-long lines are handled (or fail) before any decoding."""
        ids = self.tokenizers.encode(lines, side="src")
        ids = [self._fit(row, f"{source}:{i + 1}") for i, row in enumerate(ids)]
        order = sorted(range(len(lines)), key=lambda i: len(ids[i]))
        out = [""] * len(lines)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            texts = self._decode([lines[i] for i in chunk], [ids[i] for i in chunk])
            for i, text in zip(chunk, texts, strict=True):
                out[i] = text
        return out

    def _fit(self, row: list[int], where: str) -> list[int]:
        """`row`, truncated with a warning if too long (TranslationError if on_long='fail')."""
        if len(row) <= self.max_src_tokens:
            return row
        message = (
            f"{where}: {len(row)} tokens, more than the model's limit of {self.max_src_tokens} "
            "(max_positions - 1)"
        )
        if self.on_long == "fail":
            raise TranslationError(f"{message}; split the line or set on_long=truncate")
        log.warning("%s; truncated", message)
        return row[: self.max_src_tokens]

    def _decode(self, lines: list[str], ids: list[list[int]]) -> list[str]:
        """Decode the token rows `ids` of `lines` (one batch); '' for blank lines."""
        out = [""] * len(lines)
        keep = [i for i, line in enumerate(lines) if line.strip() and ids[i]]
        if keep:
            src, _ = collate_sources([ids[i] for i in keep])
            texts = self.module.translate_batch(src.to(self.module.device), self.decode)
            for i, text in zip(keep, texts, strict=True):
                out[i] = text
        return out


def translate_stream(
    translator: Translator,
    lines: Iterable[str | bytes],
    out: TextIO,
    batch_size: int,
    source: str,
) -> int:
    """Translate `lines` batch by batch, writing and flushing each batch's translations to
    `out` (one per line, newline-terminated); returns the number of lines."""
    batch: list[str] = []
    count = 0
    for count, line in enumerate(lines, start=1):
        if isinstance(line, bytes):  # decoded line by line, so an error can name its line
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as error:
                if batch:  # what came before the bad line is translated and kept
                    _write(out, translator, batch, count - len(batch), source)
                raise TranslationError(
                    f"{source}:{count}: not valid UTF-8 ({error.reason} at byte "
                    f"{error.start}); the {count - 1} lines before it were translated"
                ) from None
        batch.append(line.rstrip("\r\n"))
        if len(batch) == batch_size:
            _write(out, translator, batch, count - len(batch) + 1, source)
            batch = []
    if batch:
        _write(out, translator, batch, count - len(batch) + 1, source)
    return count


def _write(out: TextIO, translator: Translator, batch: list[str], first: int, source: str) -> None:
    try:
        texts = translator.translate(batch, first, source)
    except LongLineError as error:
        out.writelines(f"{text}\n" for text in error.done)
        out.flush()
        raise
    out.writelines(f"{text}\n" for text in texts)
    out.flush()


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


def run(cfg: DictConfig | dict) -> int:
    """What `python translate.py` does; returns the number of lines translated."""
    config = to_schema(cfg, TranslateConfig)
    same = "-" not in (config.input, config.output)
    if same and Path(config.input).resolve() == Path(config.output).resolve():
        raise TranslationError(f"input and output are the same file ({config.input})")
    module = load_checkpoint(config.ckpt_path, config.device, config.tokenizer)  # type: ignore[arg-type]
    translator = Translator(
        module, decode_config(module.decode_config, config.decode), config.on_long
    )
    source = "<stdin>" if config.input == "-" else config.input
    with _open(config.input, "r") as src, _open(config.output, "w") as out:
        batch_size = 1 if src.isatty() else config.batch_size  # answer each typed line
        count = translate_stream(translator, src, out, batch_size, source)
    log.info("translated %d lines from %s (decode: %s)", count, source, translator.decode)
    return count
