"""`aiayn.kernels.accelerate`: the CPU kernels are applied to a plain model from outside, and a
model on them computes what the plain model (torch's kernels, what GPUs run) computes: the
same outputs, gradients and cached decoding for every model variant, to float32 rounding;
same parameters and state dict; and `torch` takes them back off."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from aiayn.kernels import accelerate
from aiayn.kernels.dropout import CPUDropout
from aiayn.kernels.linear import CPULinear, CPUOutputProjection
from aiayn.model import build_model
from aiayn.model.embedding import OutputProjection
from tests.model.model_helpers import random_tokens, tiny_config
from tests.model.test_transformer import with_head_dims

NO_DROPOUT = {
    "dropout": 0.0,
    "activation_dropout": 0.0,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
}
CASES = [*with_head_dims(6), pytest.param({"arch": "rnn", "num_heads": 1}, None, id="rnn")]


def _pair(stack: dict, head_dim: int | None) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    plain = build_model(tiny_config(**{**stack, **NO_DROPOUT}, head_dim=head_dim))
    return plain, accelerate(copy.deepcopy(plain), "cpu")


def _kinds(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()}


@pytest.mark.parametrize(("stack", "head_dim"), CASES)
def test_the_cpu_kernels_give_torchs_outputs_and_gradients(stack: dict, head_dim) -> None:
    plain, fast = _pair(stack, head_dim)
    assert {CPULinear, CPUOutputProjection} <= _kinds(fast)
    assert not {CPULinear, CPUOutputProjection, CPUDropout} & _kinds(plain)
    assert plain.state_dict().keys() == fast.state_dict().keys()
    src, tgt = random_tokens(3, 7, 23, seed=3), random_tokens(3, 6, 23, seed=4)
    src[1, 5:], tgt[2, 4:] = 0, 0
    outputs = []
    for model in (plain, fast):
        model.train()
        logits = model(src, tgt)
        logits.logsumexp(-1).sum().backward()
        outputs.append((logits.detach(), {k: p.grad for k, p in model.named_parameters()}))
    (a, grads_a), (b, grads_b) = outputs
    real = tgt != 0  # outputs at padded target positions are not defined
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("stack", "head_dim"), with_head_dims(6))
def test_cached_decoding_on_the_cpu_kernels_equals_torchs_full_pass(stack: dict, head_dim):
    plain, fast = _pair(stack, head_dim)
    src, tgt = random_tokens(3, 6, 23, seed=7), random_tokens(3, 9, 23, seed=8)
    src[2, 3:] = 0
    with torch.no_grad():
        full = plain.eval()(src, tgt)
        fast.eval()
        memory = fast.encode(src, src != 0)
        cache = fast.init_cache(memory, src != 0)
        steps = [fast.decode_step(tgt[:, t : t + 1], cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_torch_takes_the_cpu_kernels_back_off_and_auto_follows_the_device() -> None:
    plain, fast = _pair({}, None)
    assert fast.drop_unpadded_masks and not plain.drop_unpadded_masks
    accelerate(fast, "torch")
    assert _kinds(fast) == _kinds(plain) and not fast.drop_unpadded_masks
    assert type(accelerate(OutputProjection(4, 5), "auto")) is CPUOutputProjection  # on the CPU
    on_meta = accelerate(copy.deepcopy(plain).to("meta"), "auto")
    assert _kinds(on_meta) == _kinds(plain)  # off the CPU: torch's own
