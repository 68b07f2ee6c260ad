"""Tiny configurations shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
import torch

from aiayn.model import ModelConfig, Transformer

PAD = 0


def tiny_config(**overrides: Any) -> ModelConfig:
    values: dict[str, Any] = dict(
        src_vocab_size=23,
        tgt_vocab_size=23,
        d_model=16,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=24,
        dropout=0.0,
        max_positions=40,
        pad_id=PAD,
    )
    values.update(overrides)
    return ModelConfig(**values)


def tiny_model(seed: int = 0, **overrides: Any) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


def random_tokens(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    """Real (non-special) tokens: ids in [4, vocab)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=generator)


@contextmanager
def packed_if(model: Any, on: bool) -> Iterator[None]:
    """With ``on``, the block decodes ``model`` on the CPU kernels (`aiayn.kernels.accelerate`)
    with MKL-packed weights (`aiayn.kernels.linear.packed_weights`, whatever this CPU's
    default); skips the test where torch has no MKL."""
    from aiayn.kernels import accelerate, linear

    if not on:
        yield
        return
    if not linear.MKL_PACKING:
        pytest.skip("this torch has no MKL to pack weights with")
    if isinstance(model, torch.nn.Module):
        accelerate(model, "cpu")
    with mock.patch.object(linear, "PACKING", True), linear.packed_weights(model):
        yield
