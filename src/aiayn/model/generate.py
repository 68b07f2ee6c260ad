"""Greedy, sampling and batched beam-search decoding on the key/value cache (pure PyTorch).

``generate`` runs under ``torch.inference_mode``; putting the model in eval mode (no dropout)
is the caller's job. The special ids come from ``model.config`` (``bos_id``, ``eos_id``,
``pad_id``).

Scores: a hypothesis' score is ``sum log p(y_i) / ((5 + |Y|) / 6) ** length_penalty`` (GNMT),
where ``|Y|`` counts the scored tokens: its tokens plus the EOS when it ended with one. A
hypothesis that reaches the maximum length (``max_len_a * |src| + max_len_b`` tokens, per
sentence, capped to ``max_positions``) stops there without an EOS. Beam search keeps a
sentence's ``beam_size`` best unfinished hypotheses, collects those that emit EOS within the
top ``beam_size`` candidates of a step, and finishes the sentence once it has ``beam_size``
of them (as fairseq); decoding stops as soon as every sentence is finished. In every
strategy a sentence that is finished leaves the batch and the cache (its ``beam_size`` rows in
beam search), so the later steps cost only what is still decoding: at once on the CPU; on
other devices greedy search and sampling look every `SHRINK_EVERY` steps, since each look
waits for the device (finished rows idle until then, their outputs unchanged). Sampling draws
each token from the model's distribution divided by ``temperature`` and cut to the ``top_k``
most likely tokens and to the smallest set whose probability reaches ``top_p``, with a
generator seeded by ``seed`` (the same seed and batch give the same samples; since finished
sentences leave the batch, a sentence's draws depend on when the others in its batch end);
its score is that of the model's own log-probabilities of the drawn tokens.

On a GPU, greedy and beam search of a Transformer run on a `StaticKVCache`, each step (the
decoder, the search's bookkeeping, the cache's reorder) one CUDA graph (``cuda_graphs``,
`aiayn.model.static_search`): one launch a step instead of hundreds, the batch kept whole to
the end (finished sentences idle, their outputs unchanged), the device read every
`SHRINK_EVERY` steps and once at the end. They give the results of the searches above
(`tests/model/test_generate.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from aiayn.model.build import Cache, Model
from aiayn.model.masks import padding_mask
from aiayn.model.search import (
    SHRINK_EVERY,
    Hypothesis,
    length_penalty,
    next_logprobs,
    one_each,
)
from aiayn.model.static_search import beam_search, greedy_search
from aiayn.model.transformer import Transformer

if TYPE_CHECKING:
    from aiayn.model.ensemble import Ensemble

STRATEGIES = ("greedy", "beam", "sample")
# greedy and sampling: steps between two reads of which sentences ended (each read waits for
# the device): every step on the CPU, where a finished sentence's compute is saved at once
CPU_SHRINK_EVERY = 1


@dataclass
class DecodeConfig:
    """Decoding settings (a Hydra group: ``decode=greedy|beam``). Paper: beam 4, alpha 0.6,
    max output length input + 50."""

    strategy: str = "greedy"
    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT alpha: score / ((5 + |Y|) / 6) ** alpha
    max_len_a: float = 1.0  # max output length = a * |src| + b
    max_len_b: int = 50
    nbest: int = 1
    # strategy='sample': 0 = no top-k cut; 1.0 = no nucleus (top-p) cut
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    # text every output starts with (tokenized with the target tokenizer; its tokens are
    # forced and scored); translate.py prefix_file gives one per input line
    prefix: str | None = None
    # greedy and beam search of a Transformer on a StaticKVCache, its step one CUDA graph:
    # None = on a GPU; true elsewhere runs the same fixed-shape loop without graphs
    cuda_graphs: bool | None = None

    def __post_init__(self) -> None:
        self.validate()

    def updated(self, overrides: Mapping[str, Any]) -> DecodeConfig:
        """A validated copy with `overrides` on top (e.g. a checkpoint's settings plus the
        command line's); ValueError names an unknown key or a bad value."""
        keys = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(keys))
        if unknown:
            raise ValueError(f"DecodeConfig.{unknown[0]} is not a setting; keys: {', '.join(keys)}")
        return replace(self, **overrides)

    def validate(self) -> None:
        """Raise ValueError naming the offending field."""
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"DecodeConfig.strategy={self.strategy!r} is unknown; use one of {STRATEGIES}"
            )
        for name in ("beam_size", "nbest"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"DecodeConfig.{name} must be a positive integer, got {value!r}")
        if self.strategy == "beam" and self.nbest > self.beam_size:
            raise ValueError(
                f"DecodeConfig.nbest={self.nbest} exceeds DecodeConfig.beam_size={self.beam_size}"
            )
        if self.strategy != "beam" and self.nbest != 1:
            raise ValueError(
                f"DecodeConfig.nbest={self.nbest} needs strategy='beam' ({self.strategy} gives one)"
            )
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"DecodeConfig.top_k must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"DecodeConfig.top_p must lie in (0, 1], got {self.top_p!r}")
        if not _finite(self.temperature) or not self.temperature > 0:
            raise ValueError(
                f"DecodeConfig.temperature must be a finite number > 0, got {self.temperature!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"DecodeConfig.seed must be an integer, got {self.seed!r}")
        for name in ("length_penalty", "max_len_a"):
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                raise ValueError(f"DecodeConfig.{name} must be a finite number >= 0, got {value!r}")
        if self.prefix is not None and not isinstance(self.prefix, str):
            raise ValueError(f"DecodeConfig.prefix must be text, got {self.prefix!r}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ValueError(
                f"DecodeConfig.cuda_graphs must be true, false or null, got {self.cuda_graphs!r}"
            )
        if self.cuda_graphs and self.strategy == "sample":
            raise ValueError(
                "DecodeConfig.cuda_graphs=true serves greedy and beam search; sampling's batch "
                "shrinks as sentences end: set cuda_graphs=null"
            )
        if not isinstance(self.max_len_b, int) or isinstance(self.max_len_b, bool):
            raise ValueError(f"DecodeConfig.max_len_b must be an integer, got {self.max_len_b!r}")
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ValueError(
                f"DecodeConfig.max_len_b={self.max_len_b} with max_len_a=0 cuts every output to "
                "one token: the limit is max_len_a * source length + max_len_b"
            )


def _finite(value: Any) -> bool:
    """A real number (not a bool), neither infinite nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def max_output_lengths(
    src_lengths: list[int], config: DecodeConfig, max_positions: int
) -> list[int]:
    """Per sentence ``int(a * |src| + b)``, clamped to ``[1, max_positions]``."""
    return [
        min(max(int(config.max_len_a * n + config.max_len_b), 1), max_positions)
        for n in src_lengths
    ]


@torch.inference_mode()
def generate(
    model: Model | Ensemble,
    src: Tensor,
    config: DecodeConfig,
    src_mask: Tensor | None = None,
    prefix: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Translate ``src (B, S)`` (``src_mask (B, S)`` True = real; default from ``pad_id``).

    ``model`` is a Transformer, an LSTM (`AttentionLSTM`) or an `Ensemble` of them.
    Decoding starts from ``model.config.bos_id`` and a hypothesis ends at
    ``model.config.eos_id``. Returns B lists of ``config.nbest`` hypotheses, best first. A
    sentence decodes the same alone and inside a padded batch; ``beam_size=1`` gives exactly
    the greedy result. ``prefix`` (B lists of target ids, [] for none) forces the start of
    each output, for every strategy: the prefix's tokens are in the hypothesis and its score,
    and the length limit grows to hold them.
    """
    if src_mask is None:
        src_mask = padding_mask(src, model.config.pad_id)
    max_positions = model.config.max_positions
    max_lens = max_output_lengths(src_mask.sum(dim=-1).tolist(), config, max_positions)
    vocab = model.config.tgt_vocab_size
    forced = _forced_tokens(prefix, len(max_lens), max_positions, vocab, src.device)
    if forced is not None:  # room for each row's prefix and one more token
        needed = (forced >= 0).sum(dim=1).add(1).tolist()
        max_lens = [min(max(n, m), max_positions) for n, m in zip(max_lens, needed, strict=True)]
    alpha, k = config.length_penalty, config.beam_size
    if _on_static_cache(model, config, src.device):
        if config.strategy == "beam":  # k rows a sentence from the start
            src, src_mask = src.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)
            forced = forced.repeat_interleave(k, dim=0) if forced is not None else None
        cache = model.init_cache(model.encode(src, src_mask), src_mask, capacity=max(max_lens))
        if config.strategy == "greedy":
            return greedy_search(model, cache, max_lens, alpha, forced)
        return beam_search(model, cache, max_lens, k, config.nbest, alpha, forced)
    cache = model.init_cache(model.encode(src, src_mask), src_mask)

    def decode(tokens: Tensor) -> Tensor:
        return model.decode_step(tokens, cache)

    if config.strategy != "beam":
        pick = _argmax if config.strategy == "greedy" else _sampler(config, src.device)
        return _greedy(model, decode, cache, max_lens, alpha, src.device, pick, forced)
    if forced is not None:
        forced = forced.repeat_interleave(k, dim=0)
    return _beam(model, decode, cache, max_lens, k, config.nbest, alpha, src.device, forced)


def _on_static_cache(model: Model | Ensemble, config: DecodeConfig, device: torch.device) -> bool:
    """Whether this decode runs on a `StaticKVCache` (`DecodeConfig.cuda_graphs`; null: a
    Transformer's greedy or beam search on a GPU). ValueError for a model that has none."""
    if config.cuda_graphs is False or config.strategy == "sample":
        return False
    if not isinstance(model, Transformer):
        if config.cuda_graphs:
            raise ValueError(
                "DecodeConfig.cuda_graphs=true needs a single Transformer; "
                f"{type(model).__name__} decodes on its own cache: set cuda_graphs=null"
            )
        return False
    return bool(config.cuda_graphs) or device.type == "cuda"


def _forced_tokens(
    prefix: Sequence[Sequence[int]] | None,
    batch: int,
    max_positions: int,
    vocab: int,
    device: torch.device,
) -> Tensor | None:
    """``prefix`` as ``(B, P)`` ids, -1 past each row's prefix; None without one."""
    if prefix is None or not any(prefix):
        return None
    if len(prefix) != batch:
        raise ValueError(f"prefix has {len(prefix)} rows for a batch of {batch}")
    width = max(len(row) for row in prefix)
    if width >= max_positions:
        raise ValueError(
            f"a prefix of {width} tokens leaves no room in the model's {max_positions} positions"
        )
    bad = next((t for row in prefix for t in row if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"prefix token {bad} is not in the target vocabulary (0..{vocab - 1})")
    forced = torch.full((batch, width), -1, dtype=torch.long)
    for i, row in enumerate(prefix):
        forced[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return forced.to(device)


# one decoder step: the next tokens (N, 1) -> logits (N, 1, V), the cache moved on
Step = Callable[[Tensor], Tensor]


# log-probabilities (N, V) -> the chosen token's (log-probability (N, 1), id (N, 1))
Pick = Callable[[Tensor], tuple[Tensor, Tensor]]


def _argmax(logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """The most likely token of each row: (its log-probability (N, 1), its id (N, 1))."""
    best, token = logprobs.max(dim=-1, keepdim=True)
    return best, token


def _sampler(config: DecodeConfig, device: torch.device) -> Pick:
    """A `pick` that draws each row's token as `config` says (seeded, reproducible)."""
    generator = torch.Generator(device=device).manual_seed(config.seed)

    def pick(logprobs: Tensor) -> tuple[Tensor, Tensor]:
        scores = logprobs / config.temperature
        if config.top_k:
            kth = scores.topk(min(config.top_k, scores.size(-1)), dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if config.top_p < 1:
            ordered, order = scores.sort(dim=-1, descending=True)
            probs = ordered.softmax(dim=-1)
            beyond = probs.cumsum(dim=-1) - probs >= config.top_p  # the first always stays
            scores = scores.scatter(-1, order, ordered.masked_fill(beyond, float("-inf")))
        token = torch.multinomial(scores.softmax(dim=-1), 1, generator=generator)
        return logprobs.gather(-1, token), token

    return pick


def _greedy(
    model: Model | Ensemble,
    decode: Step,
    cache: Cache,
    max_lens: list[int],
    alpha: float,
    device: torch.device,
    pick: Pick,
    forced: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """One token per step, chosen by `pick` (`_argmax`: greedy search; `_sampler`). A sentence
    that ends leaves the batch (and the cache) at the next look (at once on the CPU)."""
    B, steps = len(max_lens), max(max_lens)
    bos_id, eos_id = model.config.bos_id, model.config.eos_id
    rows = torch.arange(B, device=device)  # the sentence of each row still decoding
    limit = torch.tensor(max_lens, device=device)
    token = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    score = torch.zeros(B, device=device)
    length = torch.zeros(B, dtype=torch.long, device=device)  # scored tokens (incl. EOS)
    out = torch.full((B, steps), eos_id, dtype=torch.long, device=device)
    ended = torch.zeros(B, dtype=torch.bool, device=device)  # of the rows still in the batch
    every = CPU_SHRINK_EVERY if device.type == "cpu" else SHRINK_EVERY
    for step in range(steps):
        best, token = pick(next_logprobs(decode(token), forced, step))
        score[rows] += best[:, 0].masked_fill(ended, 0.0)
        length[rows] += (~ended).long()
        out[rows, step] = token[:, 0].masked_fill(ended, eos_id)
        ended = ended | (token[:, 0] == eos_id) | (step + 1 >= limit)
        if (step + 1) % every and step + 1 < steps:
            continue  # no read of the device this step
        if bool(ended.any()):
            if bool(ended.all()):
                break
            going = (~ended).nonzero()[:, 0]
            cache.reorder(going)
            rows, limit, token, ended = rows[going], limit[going], token[going], ended[going]
            forced = forced[going] if forced is not None else None
    return one_each(out, length, score, eos_id, alpha)


def _beam(
    model: Model | Ensemble,
    decode: Step,
    cache: Cache,
    max_lens: list[int],
    k: int,
    nbest: int,
    alpha: float,
    device: torch.device,
    forced: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search (see the module docstring). A sentence that is finished leaves the
    batch (its ``k`` rows of the cache) at once."""
    B = len(max_lens)
    bos_id, eos_id = model.config.bos_id, model.config.eos_id
    cache.reorder(torch.arange(B, device=device).repeat_interleave(k))
    sentences = list(range(B))  # the sentence of each group of k rows still decoding
    tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)  # BOS + prefix
    scores = torch.zeros(B, k, device=device)
    scores[:, 1:] = float("-inf")  # all beams start equal: expand only the first
    rank = torch.arange(2 * k, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for step in range(max(max_lens)):
        n = len(sentences)
        first_row = torch.arange(n, device=device)[:, None] * k
        logprobs = next_logprobs(decode(tokens[:, -1:]), forced, step)  # (n*k, V)
        V = logprobs.size(-1)
        candidates = (scores.view(-1, 1) + logprobs).view(n, k * V)
        top_scores, top_index = candidates.topk(2 * k, dim=-1)  # (n, 2k), best first
        top_beam, top_token = top_index // V, top_index % V
        is_eos = top_token == eos_id
        # hypotheses ending with EOS among the k best candidates are finished (|Y| = step + 1)
        penalty = length_penalty(step + 1, alpha)
        eos_hits = (is_eos[:, :k] & torch.isfinite(top_scores[:, :k])).nonzero().tolist()
        if eos_hits:
            rows = (first_row + top_beam).tolist()
            eos_scores = top_scores.tolist()
            for i, j in eos_hits:
                if len(finished[sentences[i]]) < k:
                    prefix = tokens[rows[i][j], 1:].tolist()
                    finished[sentences[i]].append(Hypothesis(prefix, eos_scores[i][j] / penalty))
        # the k best candidates not ending with EOS go on (each beam has one EOS among its
        # candidates, so at least k of the 2k are not EOS)
        keep = (is_eos.long() * (2 * k) + rank).argsort(dim=-1)[:, :k]
        scores = top_scores.gather(1, keep)
        new_token = top_token.gather(1, keep)
        rows = (first_row + top_beam.gather(1, keep)).view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), new_token.view(-1, 1)], dim=1)
        going = []
        for i, b in enumerate(sentences):
            if len(finished[b]) >= k:
                continue
            if step + 1 >= max_lens[b]:  # length limit: the alive beams stop here
                alive = scores[i].tolist()
                for j in range(k):
                    if alive[j] != float("-inf"):
                        prefix = tokens[i * k + j, 1:].tolist()
                        finished[b].append(Hypothesis(prefix, alive[j] / penalty))
                continue
            going.append(i)
        if not going:
            break
        if len(going) == n:
            cache.reorder(rows, cross=False)
            continue
        # the finished sentences' rows leave; the others take their beams' rows, as above
        group = torch.tensor(going, device=device)
        kept_rows = (group[:, None] * k + torch.arange(k, device=device)).view(-1)
        cache.reorder(rows[kept_rows])
        sentences = [sentences[i] for i in going]
        scores, tokens = scores[group], tokens[kept_rows]
        forced = forced[kept_rows] if forced is not None else None
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished]
