"""The promises of `aiayn.model.generate` that evaluation relies on, on a trained checkpoint:
beam_size=1 is greedy, and a sentence decodes the same alone as inside a padded batch."""

from __future__ import annotations

import pytest

from aiayn.data.dataset import collate_sources
from aiayn.model import DecodeConfig, generate


@pytest.fixture(scope="module")
def batch(module, sources):
    ids = module.tokenizers.encode(sources, side="src")
    assert len({len(row) for row in ids}) > 1  # padding really happens
    return ids, collate_sources(ids)[0]


def test_beam_size_one_is_greedy(module, batch):
    _, src = batch
    greedy = generate(module.model, src, DecodeConfig(strategy="greedy"))
    beam = generate(module.model, src, DecodeConfig(strategy="beam", beam_size=1))
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    for b, g in zip(beam, greedy, strict=True):
        assert b[0].score == pytest.approx(g[0].score, abs=1e-4)


@pytest.mark.parametrize("config", [DecodeConfig(), DecodeConfig(strategy="beam", beam_size=3)])
def test_alone_equals_in_padded_batch(module, batch, config):
    ids, src = batch
    together = generate(module.model, src, config)
    for row, hyps in zip(ids, together, strict=True):
        alone = generate(module.model, collate_sources([row])[0], config)[0]
        assert alone[0].tokens == hyps[0].tokens
        assert alone[0].score == pytest.approx(hyps[0].score, abs=1e-4)
