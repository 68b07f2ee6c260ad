"""`aiayn.model.dropout`: masks drawn from 31-bit integers keep each element with probability
1 - p, independently, scale what they keep by 1 / (1 - p), back-propagate through the same
mask, and follow the seed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.model.dropout import Dropout, dropout

N = 1 << 21


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_each_element_is_dropped_with_probability_p_independently(p):
    torch.manual_seed(0)
    out = dropout(torch.ones(N), p)
    dropped = out == 0
    sigma = (p * (1 - p) / N) ** 0.5
    assert abs(dropped.float().mean().item() - p) < 5 * sigma
    assert torch.all(out[~dropped] == 1 / (1 - p))  # kept values scaled, none altered
    both = (dropped[0::2] & dropped[1::2]).float().mean().item()  # neighbours independent
    assert abs(both - p * p) < 5 * (p * p * (1 - p * p) / (N // 2)) ** 0.5


def test_the_gradient_goes_through_the_same_mask():
    torch.manual_seed(1)
    x = (torch.rand(64, 24, 32) + 0.5).requires_grad_()  # no zeros: the output shows the mask
    grad = torch.randn(64, 24, 32)
    out = dropout(x, 0.1)
    out.backward(grad)
    kept = out != 0
    assert torch.equal(out, torch.where(kept, x * (1 / 0.9), 0.0).detach())
    torch.testing.assert_close(x.grad, torch.where(kept, grad / 0.9, 0.0))


def test_masks_follow_the_seed_and_bf16_stays_bf16():
    x = torch.randn(8, 100, dtype=torch.bfloat16)
    torch.manual_seed(7)
    a = dropout(x, 0.2)
    torch.manual_seed(7)
    b = dropout(x, 0.2)
    c = dropout(x, 0.2)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(b, c)


def test_evaluation_p0_and_p1_are_torchs():
    x = torch.randn(4, 5)
    module = Dropout(0.5).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), F.dropout(x, 1.0))
    assert Dropout(0.3).state_dict() == {} and repr(Dropout(0.3)) == repr(torch.nn.Dropout(0.3))
