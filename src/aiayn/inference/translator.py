"""`Translator`: raw text lines in, translated lines out, with one model and its
tokenizers. Training's validation decodes through it too, so there is one decode path.

Sources are laid out exactly as in training (`x + <eos>`, see
`aiayn.data.dataset.collate_sources`). An empty (or blank) line translates to an empty line
without touching the model, so output line i always belongs to input line i. A line longer
than the model's positions (`max_positions - 1` tokens, room for `<eos>`) is truncated with a
warning naming its file and line (`on_long='truncate'`) or raises `LongLineError`
(`on_long='fail'`) carrying the translations of the lines before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from aiayn.data.dataset import collate_sources
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import ConfigError, TranslationError
from aiayn.kernels.linear import packed_weights
from aiayn.model import DecodeConfig, Hypothesis, Model, generate

log = logging.getLogger(__name__)

ON_LONG = ("truncate", "fail")


class LongLineError(TranslationError):
    """A line over the length limit with `on_long='fail'`; `done` holds the translations of
    the lines before it (for the caller to write before stopping): strings from `translate`,
    n-best lists from `translate_nbest`."""

    def __init__(self, message: str, done: list[Any]) -> None:
        super().__init__(message)
        self.done = done


def decode_config(base: DecodeConfig, overrides: dict[str, Any]) -> DecodeConfig:
    """`base.updated(overrides)` with errors as ConfigError naming the `decode.<key>`."""
    try:
        return base.updated(overrides)
    except ValueError as error:
        raise ConfigError(str(error).replace("DecodeConfig.", "decode.")) from None


def check_beam(decode: DecodeConfig, vocab_size: int) -> None:
    """A beam wider than the target vocabulary has nothing to fill it with (and holds beam x
    vocabulary scores a step): ConfigError."""
    if decode.strategy == "beam" and decode.beam_size > vocab_size:
        raise ConfigError(
            f"decode.beam_size={decode.beam_size} exceeds the target vocabulary "
            f"({vocab_size} tokens): choose a beam of at most {vocab_size}"
        )


class Translator:
    """Translate with `model` (put it in eval mode first) and `tokenizers`, decoding as `decode`
    says. `max_src_tokens = max_positions - 1` (the source gets `<eos>` appended)."""

    def __init__(
        self,
        model: Model,
        tokenizers: Tokenizers,
        decode: DecodeConfig,
        on_long: str = "truncate",
    ) -> None:
        if on_long not in ON_LONG:
            raise ConfigError(f"on_long must be one of {ON_LONG}, got {on_long!r}")
        self.model, self.tokenizers, self.decode, self.on_long = model, tokenizers, decode, on_long
        self.max_src_tokens = self.max_positions - 1

    @property
    def max_positions(self) -> int:
        return self.model.config.max_positions

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def with_settings(
        self, decode: dict[str, Any] | None = None, on_long: str | None = None
    ) -> Translator:
        """A Translator on the same model with `decode` keys on top of this one's settings."""
        settings = decode_config(self.decode, decode or {})
        check_beam(settings, self.tokenizers.tgt_vocab_size)
        return Translator(self.model, self.tokenizers, settings, on_long or self.on_long)

    def decoding(self) -> AbstractContextManager[None]:
        """Held over a run of batches: the model's weights packed once for all of them
        (`aiayn.kernels.linear.packed_weights`; nothing for a CTranslate2 engine)."""
        return packed_weights(self.model)

    def generate(
        self,
        src: Tensor,
        decode: DecodeConfig | None = None,
        prefix: list[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """`src (B, S)` token ids (x + EOS, as `Batch.src`) -> n-best hypotheses per row;
        `prefix`: target ids each row's output must start with ([] for none)."""
        config = decode or self.decode
        try:
            return generate(self.model, src.to(self.device), config, prefix=prefix)
        except ValueError as error:  # a prefix the model cannot hold
            raise TranslationError(f"decode.prefix: {error}") from None

    def translate_batch(self, src: Tensor, decode: DecodeConfig | None = None) -> list[str]:
        """The best detokenized translation of each row of `src (B, S)`."""
        text = (decode or self.decode).prefix
        prefix = self.tokenizers.encode([text] * src.size(0), side="tgt") if text else None
        hyps = self.generate(src, decode, prefix)
        return self.tokenizers.decode([h[0].tokens for h in hyps], side="tgt")

    def translate(
        self,
        lines: list[str],
        first_line: int = 1,
        source: str = "<input>",
        prefixes: list[str] | None = None,
    ) -> list[str]:
        """One translation per line, in order ('' for a blank line), in one batch;
        `first_line` and `source` only name lines in messages; `prefixes` (one per line)
        force the start of each translation (default: `decode.prefix`, if set)."""
        try:
            nbest = self.translate_nbest(lines, first_line, source, prefixes)
            return [_best(hyps) for hyps in nbest]
        except LongLineError as error:
            raise LongLineError(str(error), [_best(hyps) for hyps in error.done]) from None

    def translate_nbest(
        self,
        lines: list[str],
        first_line: int = 1,
        source: str = "<input>",
        prefixes: list[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """The `decode.nbest` best (translation, score) pairs of each line, best first, in one
        batch ([('', 0.0)] for a blank line). A `LongLineError` carries those of the lines
        before the long one in `done`."""
        ids = self.tokenizers.encode(lines, side="src")
        forced = self._prefix_ids(len(lines), prefixes)
        for i, row in enumerate(ids):
            try:
                ids[i] = self._fit(row, f"{source}:{first_line + i}")
            except TranslationError as error:
                # rows before i are already fitted
                done = self._decode(lines[:i], ids[:i], forced[:i])
                raise LongLineError(str(error), done) from None
        return self._decode(lines, ids, forced)

    def _prefix_ids(self, count: int, prefixes: list[str] | None) -> list[list[int]]:
        """Target ids of each line's forced prefix: `prefixes[i]`, else `decode.prefix`."""
        if prefixes is None and not self.decode.prefix:
            return [[] for _ in range(count)]  # nothing forced: no tokenizer call per line
        if prefixes is None:
            prefixes = [self.decode.prefix] * count
        if len(prefixes) != count:
            raise TranslationError(f"{len(prefixes)} prefixes for {count} lines")
        return self.tokenizers.encode(prefixes, side="tgt")

    def translate_all(
        self,
        lines: list[str],
        batch_size: int,
        source: str = "<input>",
        advance: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Translate a whole corpus in length-sorted batches (less padding), in input order.
        Over-long lines are handled (or fail) before any decoding; `advance(n)` is called
        after each batch of n lines."""
        ids = self.tokenizers.encode(lines, side="src")
        ids = [self._fit(row, f"{source}:{i + 1}") for i, row in enumerate(ids)]
        forced = self._prefix_ids(len(lines), None)
        order = sorted(range(len(lines)), key=lambda i: len(ids[i]))
        out = [""] * len(lines)
        with self.decoding():
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                rows = [ids[i] for i in chunk]
                hyps = self._decode([lines[i] for i in chunk], rows, [forced[i] for i in chunk])
                for i, nbest in zip(chunk, hyps, strict=True):
                    out[i] = _best(nbest)
                if advance is not None:
                    advance(len(chunk))
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

    def _decode(
        self, lines: list[str], ids: list[list[int]], forced: list[list[int]]
    ) -> list[list[tuple[str, float]]]:
        """(translation, score) n-best of the token rows `ids` of `lines` (one batch), each
        starting with its `forced` target ids; [('', 0.0)] for blank lines."""
        out: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        keep = [i for i, line in enumerate(lines) if line.strip() and ids[i]]
        if keep:
            src, _ = collate_sources([ids[i] for i in keep])
            prefix = [forced[i] for i in keep]
            hyps = self.generate(src, prefix=prefix if any(prefix) else None)
            texts = iter(self.tokenizers.decode([h.tokens for row in hyps for h in row], "tgt"))
            for i, row in zip(keep, hyps, strict=True):
                out[i] = [(next(texts), h.score) for h in row]
        return out


def _best(nbest: list[tuple[str, float]]) -> str:
    return nbest[0][0]
