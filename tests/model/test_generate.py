"""Greedy and beam-search decoding."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from model_helpers import PAD, packed_if, random_tokens, tiny_model

from aiayn.model import DecodeConfig, Hypothesis, Transformer, generate
from aiayn.model.generate import length_penalty

BOS, EOS = 1, 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"strategy": "nucleus"}, "strategy"),
        ({"strategy": "sample", "nbest": 2}, "nbest"),
        ({"strategy": "sample", "top_k": -1}, "top_k"),
        ({"strategy": "sample", "top_p": 0.0}, "top_p"),
        ({"strategy": "sample", "top_p": 1.5}, "top_p"),
        ({"strategy": "sample", "temperature": 0.0}, "temperature"),
        ({"seed": 1.5}, "seed"),
        ({"beam_size": 0}, "beam_size"),
        ({"nbest": 0}, "nbest"),
        ({"strategy": "beam", "beam_size": 2, "nbest": 3}, "nbest"),
        ({"strategy": "greedy", "nbest": 2}, "nbest"),
        ({"length_penalty": -1.0}, "length_penalty"),
        ({"max_len_a": -0.5}, "max_len_a"),
        ({"max_len_b": 1.5}, "max_len_b"),
    ],
)
def test_invalid_decode_config_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"DecodeConfig\.{field}\b"):
        DecodeConfig(**overrides)


def peaky_model(seed: int = 0, eos_id: int = EOS) -> Transformer:
    """A random tiny model with sharper output distributions (varied, source-dependent); the
    weights depend on ``seed`` only."""
    model = tiny_model(seed, share_embeddings="none", norm_first=True, eos_id=eos_id)
    with torch.no_grad():
        model.output.weight.mul_(4.0)
    return model


def padded_batch() -> tuple[torch.Tensor, list[int]]:
    lengths = [5, 9, 3]
    src = random_tokens(3, 9, 23, seed=21)
    for row, n in enumerate(lengths):
        src[row, n:] = PAD
    return src, lengths


@pytest.mark.parametrize("packed", [False, True], ids=["weights", "packed weights"])
def test_beam_size_one_equals_greedy(packed: bool) -> None:
    model = peaky_model()
    src, lengths = padded_batch()
    with packed_if(model, packed):
        greedy = generate(model, src, DecodeConfig(max_len_b=6))
        beam = generate(model, src, DecodeConfig("beam", beam_size=1, max_len_b=6))
    assert beam == greedy  # tokens and scores, exactly
    assert [len(h) for h in greedy] == [1, 1, 1]
    # some hypotheses end with EOS and some at the length limit, so both paths are compared
    limits = [n + 6 for n in lengths]  # a * |src| + b with a = 1, b = 6
    ended = set()
    for eos_id in (5, 9, 13):
        model = peaky_model(eos_id=eos_id)
        with packed_if(model, packed):
            greedy = generate(model, src, DecodeConfig(max_len_b=6))
            beam = generate(model, src, DecodeConfig("beam", beam_size=1, max_len_b=6))
        assert beam == greedy
        ended |= {len(h[0].tokens) == limit for h, limit in zip(greedy, limits, strict=True)}
    assert ended == {True, False}


def _tokens(hyps: list[list[Hypothesis]]) -> list[list[int]]:
    return [h[0].tokens for h in hyps]


def test_sampling_repeats_with_its_seed_and_differs_across_seeds() -> None:
    model = tiny_model(4)  # flat distributions: samples vary
    src, _ = padded_batch()

    def sample(**kwargs: Any) -> list[list[Hypothesis]]:
        return generate(model, src, DecodeConfig("sample", max_len_b=8, **kwargs))

    first = sample(seed=7)
    assert sample(seed=7) == first  # tokens and scores
    assert _tokens(sample(seed=8)) != _tokens(first)
    greedy = generate(model, src, DecodeConfig(max_len_b=8))
    assert _tokens(first) != _tokens(greedy)
    # a cut to the single most likely token, or a near-zero temperature, is greedy search
    assert sample(seed=7, top_k=1) == greedy
    assert sample(seed=7, top_p=1e-6) == greedy
    assert _tokens(sample(seed=7, temperature=1e-4)) == _tokens(greedy)


def test_sampling_draws_only_inside_the_top_k_and_top_p_cuts() -> None:
    """Every drawn token is among the k most likely (top_k) and within the nucleus (top_p) of
    its step, checked by replaying the sampled prefixes through the model."""
    model = tiny_model(4)
    src, lengths = padded_batch()
    for cut in ({"top_k": 3}, {"top_p": 0.5}):
        hyps = generate(model, src, DecodeConfig("sample", max_len_b=6, seed=3, **cut))
        for row, (hyp,) in enumerate(hyps):
            tokens = torch.tensor([[BOS, *hyp.tokens]])
            with torch.no_grad():
                logp = model(src[row : row + 1, : lengths[row]], tokens).log_softmax(-1)[0]
            for step, token in enumerate(hyp.tokens):
                probs, order = logp[step].exp().sort(descending=True)
                rank = (order == token).nonzero().item()
                if "top_k" in cut:
                    assert rank < 3
                else:
                    assert probs[:rank].sum() < 0.5 + 1e-6  # inside the nucleus


@pytest.mark.parametrize(
    "config",
    [DecodeConfig(max_len_b=7), DecodeConfig("beam", beam_size=3, nbest=3, max_len_b=7)],
)
@pytest.mark.parametrize("packed", [False, True], ids=["weights", "packed weights"])
def test_sentence_decodes_the_same_alone_and_in_a_padded_batch(
    config: DecodeConfig, packed: bool
) -> None:
    model = peaky_model(1, eos_id=7)
    src, lengths = padded_batch()
    with packed_if(model, packed):
        batch = generate(model, src, config)
        alones = [generate(model, src[row : row + 1, :n], config) for row, n in enumerate(lengths)]
    for row, (alone,) in enumerate(alones):
        assert [h.tokens for h in alone] == [h.tokens for h in batch[row]]
        for a, b in zip(alone, batch[row], strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_scores_are_length_normalised_logprobs_in_order() -> None:
    model = peaky_model(2, eos_id=11)
    src, _ = padded_batch()
    alpha = 0.6
    config = DecodeConfig("beam", beam_size=4, nbest=4, length_penalty=alpha, max_len_b=5)
    results = generate(model, src, config)
    for row, hyps in enumerate(results):
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4
        max_len = 5 + int((src[row] != PAD).sum())
        for h in hyps:  # recompute by teacher forcing; shorter than max_len = ended with EOS
            assert len(h.tokens) <= max_len
            target = [*h.tokens, 11] if len(h.tokens) < max_len else h.tokens
            with torch.no_grad():
                logits = model(src[row : row + 1], torch.tensor([[BOS, *target[:-1]]]))
            logprob = logits[0].log_softmax(-1).gather(1, torch.tensor(target)[:, None]).sum()
            expected = logprob.item() / length_penalty(len(target), alpha)
            assert h.score == pytest.approx(expected, abs=1e-4)


def test_length_penalty_formula() -> None:
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(13, 1.0) == pytest.approx(3.0)
    assert length_penalty(9, 0.0) == 1.0


class MarkovModel:
    """A stand-in for ``Transformer``: the next token depends on the previous one only,
    through a hand-made table of probabilities; counts ``decode_step`` calls."""

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 5) -> None:
        self.config = SimpleNamespace(
            pad_id=PAD, bos_id=BOS, eos_id=EOS, max_positions=100, tgt_vocab_size=vocab
        )
        logp = torch.full((vocab, vocab), math.log(1e-9))
        for prev, row in table.items():
            for nxt, p in row.items():
                logp[prev, nxt] = math.log(p)
        self.logp = logp
        self.calls = 0

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(src.size(0), src.size(1), 1)

    def init_cache(self, memory: torch.Tensor, src_mask: torch.Tensor) -> Any:
        return SimpleNamespace(reorder=lambda index, cross=True: None)

    def decode_step(self, tokens: torch.Tensor, cache: Any) -> torch.Tensor:
        self.calls += 1
        return self.logp[tokens[:, -1]][:, None]


A, B_ = 3, 4  # two ordinary tokens
TABLE = {
    BOS: {EOS: 0.4, A: 0.6},
    A: {B_: 0.7, EOS: 0.3},
    B_: {EOS: 0.7, A: 0.3},
}


def test_length_penalty_changes_the_winner_on_a_hand_made_case() -> None:
    src = torch.tensor([[5, 6]])
    short = math.log(0.4)  # [] then EOS: |Y| = 1
    mid = math.log(0.6) + math.log(0.3)  # [a] EOS: |Y| = 2
    long = math.log(0.6) + math.log(0.7) + math.log(0.7)  # [a b] EOS: |Y| = 3
    for alpha, best in ((0.0, []), (2.0, [A, B_])):
        config = DecodeConfig("beam", beam_size=3, nbest=3, length_penalty=alpha)
        (hyps,) = generate(MarkovModel(TABLE), src, config)  # type: ignore[arg-type]
        expected = sorted(
            [
                Hypothesis([], short / length_penalty(1, alpha)),
                Hypothesis([A], mid / length_penalty(2, alpha)),
                Hypothesis([A, B_], long / length_penalty(3, alpha)),
            ],
            key=lambda h: -h.score,
        )
        assert hyps[0].tokens == best
        assert [h.tokens for h in hyps] == [h.tokens for h in expected]
        for h, e in zip(hyps, expected, strict=True):
            assert h.score == pytest.approx(e.score, abs=1e-6)


@pytest.mark.parametrize("config", [DecodeConfig(), DecodeConfig("beam", beam_size=2)])
def test_stops_early_once_every_sentence_has_ended(config: DecodeConfig) -> None:
    model = MarkovModel({BOS: {EOS: 0.9, A: 0.05, B_: 0.05}, A: {EOS: 1.0}, B_: {EOS: 1.0}})
    src = torch.tensor([[5, 6, 7], [5, PAD, PAD]])
    results = generate(model, src, config)  # type: ignore[arg-type]
    assert [r[0].tokens for r in results] == [[], []]
    assert results[0][0].score == pytest.approx(math.log(0.9))
    assert model.calls == (1 if config.strategy == "greedy" else 2)  # not max_len = 50+


def scripted_model(
    successor: dict[int, int], vocab: int = 10, never_eos: bool = False, **overrides: Any
) -> Transformer:
    """A real Transformer whose decoder maps the previous token ``i`` to ``successor[i]``:
    sublayer outputs zeroed, one-hot target embeddings, output rows pointing back at them.
    ``never_eos``: EOS gets logit -100 whatever the input (through an unused dimension)."""
    model = tiny_model(
        tgt_vocab_size=vocab,
        src_vocab_size=vocab,
        share_embeddings="none",
        norm_first=True,
        positional="learned",
        max_positions=64,
        **overrides,
    )
    with torch.no_grad():
        for layer in model.decoder.layers:
            for linear in (layer.self_attn.out_proj, layer.cross_attn.out_proj, layer.ff.linear2):
                linear.weight.zero_()
                linear.bias.zero_()
        model.tgt_embed.positional.weight.zero_()
        model.tgt_embed.token.weight.copy_(torch.eye(vocab, 16))
        model.output.weight.zero_()
        for prev, nxt in successor.items():
            model.output.weight[nxt, prev] += 10.0
        if never_eos:
            model.decoder.norm.bias[15] = 1.0
            model.output.weight[model.config.eos_id, 15] = -100.0
    return model


@pytest.mark.parametrize(
    "config", [DecodeConfig(), DecodeConfig("beam", beam_size=3, nbest=2, length_penalty=1.0)]
)
def test_scripted_model_emits_its_sequence(config: DecodeConfig) -> None:
    model = scripted_model({BOS: 5, 5: 6, 6: 7, 7: EOS})
    src = random_tokens(2, 4, 10)
    src[1, 2:] = PAD
    results = generate(model, src, config)
    for hyps in results:
        assert hyps[0].tokens == [5, 6, 7]
        assert -0.01 < hyps[0].score <= 0.0  # near-certain
        if config.nbest > 1:
            assert hyps[1].score < hyps[0].score - 10


@pytest.mark.parametrize(
    "config", [DecodeConfig(), DecodeConfig("beam", beam_size=3, nbest=2, length_penalty=1.0)]
)
def test_special_ids_come_from_the_model_config(config: DecodeConfig) -> None:
    successor = {1: 5, 5: 6, 6: 7, 7: 2, 3: 8, 8: 9, 9: 2}  # two chains: from 1 and from 3
    src = random_tokens(2, 4, 10)
    src[1, 2:] = PAD
    for ids, expected in [
        ({}, [5, 6, 7]),  # defaults: start at 1, stop at 2
        ({"bos_id": 3}, [8, 9]),  # start elsewhere
        ({"eos_id": 6}, [5]),  # stop earlier: 6 is now the EOS
        ({"bos_id": 3, "eos_id": 9}, [8]),
    ]:
        model = scripted_model(successor, **ids)
        for hyps in generate(model, src, config):
            assert hyps[0].tokens == expected
            assert -0.01 < hyps[0].score <= 0.0  # ended with the EOS, near-certain


@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(max_len_a=1.0, max_len_b=2),
        DecodeConfig("beam", beam_size=2, max_len_a=1.0, max_len_b=2),
    ],
)
def test_respects_max_length_per_sentence(config: DecodeConfig) -> None:
    model = scripted_model({BOS: 5, 5: 6, 6: 5}, never_eos=True)
    src = random_tokens(3, 6, 10)
    src[0, 1:] = PAD
    src[2, 4:] = PAD
    results = generate(model, src, config)
    assert [len(r[0].tokens) for r in results] == [1 + 2, 6 + 2, 4 + 2]
    assert results[1][0].tokens == [5, 6, 5, 6, 5, 6, 5, 6]


def count_steps(model: Transformer) -> list[int]:
    """The rows of each `decode_step` call of `model` from now on, in a list that fills."""
    rows: list[int] = []
    step = model.decode_step

    def counted(tokens: torch.Tensor, cache: Any) -> torch.Tensor:
        rows.append(tokens.size(0))
        return step(tokens, cache)

    model.decode_step = counted  # type: ignore[method-assign]
    return rows


@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(max_len_a=1.0, max_len_b=2),
        DecodeConfig("beam", beam_size=2, max_len_a=1.0, max_len_b=2),
        DecodeConfig("sample", seed=3, max_len_a=1.0, max_len_b=2),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_a_sentence_that_has_ended_leaves_the_batch(config: DecodeConfig) -> None:
    """Sentences limited to 3, 8 and 6 tokens: each decoder step after a sentence's last one
    runs without its rows (k per sentence in beam search), and the outputs are those of the
    sentences decoded alone."""
    model = scripted_model({BOS: 5, 5: 6, 6: 5}, never_eos=True)
    src = random_tokens(3, 6, 10)
    src[0, 1:] = PAD
    src[2, 4:] = PAD
    rows = count_steps(model)
    results = generate(model, src, config)
    k = config.beam_size if config.strategy == "beam" else 1
    assert rows == [3 * k] * 3 + [2 * k] * 3 + [k] * 2
    for row, hyps in enumerate(results):
        n = int((src[row] != PAD).sum())
        (alone,) = generate(model, src[row : row + 1, :n], config)
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert len(hyps[0].tokens) == n + 2


def test_max_length_is_capped_to_max_positions() -> None:
    model = scripted_model({BOS: 5, 5: 6, 6: 5}, never_eos=True)
    (hyps,) = generate(model, random_tokens(1, 6, 10), DecodeConfig(max_len_a=20.0))
    assert len(hyps[0].tokens) == model.config.max_positions


def test_generate_in_bfloat16() -> None:
    model = scripted_model({BOS: 5, 5: 6, 6: 7, 7: EOS}).to(torch.bfloat16)
    src = random_tokens(2, 4, 10)
    src[0, 2:] = PAD
    for config in (DecodeConfig(), DecodeConfig("beam", beam_size=2, nbest=2)):
        for hyps in generate(model, src, config):
            assert hyps[0].tokens == [5, 6, 7]
            assert all(math.isfinite(h.score) for h in hyps)


@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(max_len_b=6),
        DecodeConfig("beam", beam_size=3, nbest=2, max_len_b=6),
        DecodeConfig("sample", seed=5, top_k=5, max_len_b=6),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_an_ensemble_of_one_model_twice_decodes_as_that_model(config: DecodeConfig) -> None:
    from aiayn.model.ensemble import Ensemble

    model = peaky_model()
    src, _ = padded_batch()
    alone = generate(model, src, config)
    twice = generate(Ensemble([model, model]), src, config)
    for a, b in zip(alone, twice, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_an_ensemble_averages_its_members_probabilities() -> None:
    from aiayn.model.ensemble import Ensemble

    first, second = peaky_model(0), peaky_model(1)
    src, _ = padded_batch()
    ensemble = Ensemble([first, second])
    (hyp,) = generate(ensemble, src[:1], DecodeConfig(max_len_b=4))[0]
    tokens = torch.tensor([[BOS, *hyp.tokens]])
    with torch.no_grad():
        probs = [m(src[:1, :5], tokens).softmax(-1)[0] for m in (first, second)]
    mean = (probs[0] + probs[1]) / 2
    for step, token in enumerate(hyp.tokens):  # greedy on the mean probability
        assert token == int(mean[step].argmax())
    with pytest.raises(ValueError, match="tgt_vocab_size"):
        Ensemble([first, tiny_model(0, tgt_vocab_size=19, share_embeddings="none")])


PREFIX_CONFIGS = [
    DecodeConfig(max_len_b=6),
    DecodeConfig("beam", beam_size=3, nbest=3, max_len_b=6),
    DecodeConfig("sample", seed=5, top_k=5, max_len_b=6),
]


@pytest.mark.parametrize("config", PREFIX_CONFIGS, ids=["greedy", "beam", "sample"])
def test_a_forced_prefix_starts_every_output(config: DecodeConfig) -> None:
    """Each row's output starts with its prefix (rows differ; [] forces nothing), for every
    strategy and for an ensemble; the prefix's tokens are scored as teacher forcing scores
    them; a prefix longer than the length limit is kept whole."""
    from aiayn.model.ensemble import Ensemble

    model = peaky_model(3, eos_id=11)
    src, _ = padded_batch()
    prefix = [[20, 21, 22, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15], [6], []]
    for decoder in (model, Ensemble([model, model])):
        hyps = generate(decoder, src, config, prefix=prefix)
        plain = generate(decoder, src, config)
        for row, forced in enumerate(prefix):
            for h in hyps[row]:
                assert h.tokens[: len(forced)] == forced
        assert [h.tokens for h in hyps[2]] == [h.tokens for h in plain[2]]
    assert len(hyps[0][0].tokens) >= len(prefix[0])  # longer than 1 * |src| + 6 would allow
    if config.strategy == "greedy":  # the score includes the forced tokens' log-probabilities
        (h,) = hyps[1]
        ended = len(h.tokens) < int((src[1] != PAD).sum()) + 6  # else cut at the limit
        target = [*h.tokens, 11] if ended else h.tokens
        with torch.no_grad():
            logits = model(src[1:2], torch.tensor([[BOS, *target[:-1]]]))
        logp = logits[0].log_softmax(-1).gather(1, torch.tensor(target)[:, None]).sum()
        assert h.score == pytest.approx(logp.item() / length_penalty(len(target), 0.6), abs=1e-4)


def test_forcing_the_greedy_output_s_own_start_changes_nothing() -> None:
    model = peaky_model(2, eos_id=11)
    src, _ = padded_batch()
    config = DecodeConfig(max_len_b=6)
    greedy = generate(model, src, config)
    prefix = [h[0].tokens[:2] for h in greedy]
    assert generate(model, src, config, prefix=prefix) == greedy  # tokens and scores


def test_a_prefix_that_fills_the_positions_is_refused() -> None:
    model = peaky_model()
    src, _ = padded_batch()
    width = model.config.max_positions
    with pytest.raises(ValueError, match="leaves no room"):
        generate(model, src, DecodeConfig(), prefix=[[5] * width, [], []])
    with pytest.raises(ValueError, match="prefix token 23 is not in the target vocabulary"):
        generate(model, src, DecodeConfig(), prefix=[[5, 23], [], []])


@pytest.mark.parametrize("every", [2, 3, 8])
def test_greedy_reading_the_device_every_few_steps_decodes_the_same(every, monkeypatch) -> None:
    """Off the CPU, greedy search looks at which sentences ended only every `SHRINK_EVERY`
    steps (a look waits for the device); the finished rows idle meanwhile and every
    hypothesis is the one of a look at every step: the same tokens, and the same score up to
    float32 rounding (a batch of another size rounds its products differently), for sentences
    ending with EOS and at their length limit alike."""
    import importlib

    module = importlib.import_module("aiayn.model.generate")  # the package exports a function
    src, _ = padded_batch()
    for eos_id in (5, 9, 13):
        model = peaky_model(eos_id=eos_id)
        config = DecodeConfig(max_len_b=6, length_penalty=0.6)
        each_step = generate(model, src, config)
        monkeypatch.setattr(module, "CPU_SHRINK_EVERY", every)
        looks: list[int] = []
        original = torch.Tensor.__bool__

        def counted(t, looks=looks, original=original):
            looks.append(1)
            return original(t)

        monkeypatch.setattr(torch.Tensor, "__bool__", counted)
        got = generate(model, src, config)
        monkeypatch.setattr(torch.Tensor, "__bool__", original)
        assert [h[0].tokens for h in got] == [h[0].tokens for h in each_step]
        scores = [[h[0].score for h in hyps] for hyps in (got, each_step)]
        assert scores[0] == pytest.approx(scores[1], rel=1e-5)
        monkeypatch.setattr(module, "CPU_SHRINK_EVERY", 1)
        steps = max(len(h[0].tokens) for h in each_step) + 1
        assert 0 < len(looks) <= 2 * (steps // every + 1)  # at most two reads a look


def _same_hypotheses(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    """The same tokens, in the same order, and the same scores up to float32 rounding (a
    static cache attends over masked positions too, which rounds its sums differently)."""
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    for hyps, others in zip(got, want, strict=True):
        assert [h.score for h in hyps] == pytest.approx([h.score for h in others], rel=1e-5)


STATIC_CONFIGS = [
    DecodeConfig(max_len_b=6),
    DecodeConfig("beam", beam_size=1, max_len_b=6),
    DecodeConfig("beam", beam_size=3, nbest=3, max_len_b=6),
    DecodeConfig("beam", beam_size=4, nbest=2, max_len_b=9, length_penalty=1.0),
    DecodeConfig("beam", beam_size=5, nbest=5, max_len_a=0.0, max_len_b=4),
]


@pytest.mark.parametrize("config", STATIC_CONFIGS, ids=["greedy", "b1", "b3n3", "b4n2", "b5n5"])
def test_the_static_cache_decodes_as_the_shrinking_batch(config: DecodeConfig) -> None:
    """`cuda_graphs=true` (on the CPU: the fixed-shape loop a GPU captures, run eagerly): a
    static cache, every sentence kept to the end, beam search's finished hypotheses kept on the
    device. It returns the hypotheses of the shrinking batch (`cuda_graphs=false`), for
    sentences ending with EOS early, late and at their length limit, with and without a
    forced prefix; and a sentence's output is the one it gets alone."""
    src, _ = padded_batch()
    static, shrinking = (
        config.updated({"cuda_graphs": True}),
        config.updated({"cuda_graphs": False}),
    )
    ends = set()
    for seed, eos_id in ((0, 5), (1, 9), (2, 13), (3, 11)):
        model = peaky_model(seed, eos_id=eos_id)
        want = generate(model, src, shrinking)
        _same_hypotheses(generate(model, src, static), want)
        prefix = [[20, 21], [], [6]]
        _same_hypotheses(
            generate(model, src, static, prefix=prefix),
            generate(model, src, shrinking, prefix=prefix),
        )
        ends |= {len(h.tokens) for hyps in want for h in hyps}
        n = int((src[1] != PAD).sum())
        _same_hypotheses(generate(model, src[1:2, :n], static), want[1:2])
    assert len(ends) >= 4  # outputs of several lengths: EOS at several steps and the limit


def test_static_beam_search_keeps_the_first_k_eos_hypotheses_then_the_limit_s() -> None:
    """The scripted chain 5 6 5 6 ... never ends with EOS: every hypothesis stops at the limit,
    and the static search's k alive beams are the shrinking search's, best first."""
    model = scripted_model({BOS: 5, 5: 6, 6: 5}, never_eos=True)
    src = random_tokens(3, 6, 10)
    src[0, 1:] = PAD
    src[2, 4:] = PAD
    config = DecodeConfig("beam", beam_size=3, nbest=3, max_len_a=1.0, max_len_b=2)
    got = generate(model, src, config.updated({"cuda_graphs": True}))
    _same_hypotheses(got, generate(model, src, config.updated({"cuda_graphs": False})))
    assert [len(hyps[0].tokens) for hyps in got] == [3, 8, 6]


def test_cuda_graphs_are_refused_where_they_cannot_serve() -> None:
    from aiayn.model.ensemble import Ensemble

    with pytest.raises(ValueError, match=r"DecodeConfig\.cuda_graphs=true serves greedy and beam"):
        DecodeConfig("sample", cuda_graphs=True)
    with pytest.raises(ValueError, match=r"DecodeConfig\.cuda_graphs must be"):
        DecodeConfig(cuda_graphs="yes")  # type: ignore[arg-type]
    model = peaky_model()
    src, _ = padded_batch()
    with pytest.raises(ValueError, match="needs a single Transformer; Ensemble"):
        generate(Ensemble([model, model]), src, DecodeConfig(cuda_graphs=True))
    # null: the shrinking batch off the GPU, for an ensemble too
    assert generate(Ensemble([model, model]), src, DecodeConfig()) == generate(
        Ensemble([model, model]), src, DecodeConfig(cuda_graphs=False)
    )


@pytest.mark.parametrize("config", [DecodeConfig(), DecodeConfig("beam", beam_size=3)])
def test_the_static_cache_stops_at_the_first_look_after_every_sentence_ended(
    config: DecodeConfig,
) -> None:
    """Every output ends at step 4 (5 6 7 EOS); the static loop reads the device every
    `SHRINK_EVERY` steps, so it stops at step 8 of the 54 allowed, with the same outputs."""
    from aiayn.model.search import SHRINK_EVERY

    model = scripted_model({BOS: 5, 5: 6, 6: 7, 7: EOS})
    src = random_tokens(2, 4, 10)
    calls = count_steps(model)
    results = generate(model, src, config.updated({"cuda_graphs": True}))
    assert [hyps[0].tokens for hyps in results] == [[5, 6, 7], [5, 6, 7]]
    k = config.beam_size if config.strategy == "beam" else 1
    assert calls == [2 * k] * SHRINK_EVERY


@pytest.mark.parametrize("config", STATIC_CONFIGS[:3], ids=["greedy", "b1", "b3n3"])
def test_steps_run_before_the_capture_are_undone(config: DecodeConfig, monkeypatch) -> None:
    """On a GPU the search's step runs once before its capture (a warm-up, which changes the
    search's state and the cache) and `reset` undoes it. Done here with two warm-up steps:
    the hypotheses are those of the shrinking batch, prefixes included."""
    from aiayn.model import static_search

    def warmed_up(step, reset, device):
        step()
        step()
        reset()
        return step

    monkeypatch.setattr(static_search, "replayed", warmed_up)
    src, _ = padded_batch()
    for seed, eos_id in ((0, 5), (2, 13)):
        model = peaky_model(seed, eos_id=eos_id)
        for prefix in (None, [[20, 21], [], [6]]):
            _same_hypotheses(
                generate(model, src, config.updated({"cuda_graphs": True}), prefix=prefix),
                generate(model, src, config.updated({"cuda_graphs": False}), prefix=prefix),
            )
