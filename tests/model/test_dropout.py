"""`aiayn.kernels.dropout`: masks drawn two elements from each 31-bit integer keep each element
with probability 1 - p (to within 2**-16), independently, whichever half of a draw it comes
from; they scale what they keep by the inverse of the share kept, back-propagate through the
same mask, and follow the seed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.kernels.dropout import HALF, CPUDropout, dropout, keep_mask

N = 1 << 21


def scale(p: float) -> float:
    """What a kept element is multiplied by: 1 / the share kept (1 / (1 - p) to ~2**-16)."""
    return HALF / (HALF - round(p * HALF))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.9])
def test_each_element_is_dropped_with_probability_p_independently(p):
    torch.manual_seed(0)
    out = dropout(torch.ones(N), p)
    dropped = out == 0
    assert torch.all(out[~dropped] == scale(p))  # kept values scaled, none altered
    # each half of a draw (even and odd elements: its low and high bits) at the same rate
    for half in (dropped[0::2], dropped[1::2]):
        assert abs(half.float().mean().item() - p) < 5 * (p * (1 - p) / (N // 2)) ** 0.5
    for a, b in [(0, 1), (1, 2)]:  # neighbours independent, within a draw and across two
        both = (dropped[a::2][: N // 2 - 1] & dropped[b::2][: N // 2 - 1]).float().mean().item()
        assert abs(both - p * p) < 5 * (p * p * (1 - p * p) / (N // 2 - 1)) ** 0.5


@pytest.mark.parametrize("p", [0.1, 0.5, 1 - 2**-15])
def test_each_element_compares_its_half_of_a_draw_with_that_halfs_threshold(p):
    """The mask, element by element, from the same draws decoded by hand: element 2i keeps iff
    the low 16 bits of draw i, read as a signed int16, are >= 2q - 2**15; element 2i + 1 iff
    the high 15 bits are >= q (q = round(p * 2**15)), with the halves in this machine's byte
    order."""
    q = round(p * HALF)
    torch.manual_seed(11)
    draws = torch.empty(5000, dtype=torch.int32).random_().long()
    low = ((draws & 0xFFFF) ^ 0x8000) - 0x8000
    expected = torch.stack([low >= 2 * q - HALF, (draws >> 16) >= q], dim=1).view(-1)
    torch.manual_seed(11)
    assert torch.equal(keep_mask([10000], p), expected)
    torch.manual_seed(11)
    assert torch.equal(keep_mask([9999], p), expected[:9999])  # odd: half a draw unused


def test_the_expected_output_is_the_input():
    torch.manual_seed(12)  # p = 0.1 keeps 1 - 3277 / 2**15 and scales by its inverse
    out = dropout(torch.ones(N), 0.1)
    sigma = (scale(0.1) ** 2 * 0.1 * 0.9 / N) ** 0.5
    assert abs(out.mean().item() - 1.0) < 5 * sigma


def test_any_shape_and_the_limits_of_rounding_p_to_2_to_the_minus_15ths():
    torch.manual_seed(3)
    out = dropout(torch.ones(3, 5, 7), 0.5)  # an odd number of elements: half a draw unused
    assert out.shape == (3, 5, 7) and set(out.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(4)
    assert keep_mask(torch.Size([N]), 2**-17).all()  # rounds to 0 in 2**15ths: nothing dropped
    # from 1 - 2**-16 on, p rounds to 2**15 / 2**15, where the halves' thresholds would overflow
    # and keep everything: torch's dropout takes it, and drops all but ~1 in 2**16
    for p in (1 - 2**-16, 1 - 2**-17):
        torch.manual_seed(5)
        assert (dropout(torch.ones(64), p) == 0).all()
    torch.manual_seed(6)  # just below: 2**15ths, keeping 1 in 2**15, scaled by 2**15
    out = dropout(torch.ones(N), 1 - 2**-15 - 2**-18)
    assert set(out.unique().tolist()) <= {0.0, float(HALF)} and 16 <= (out > 0).sum() <= 128


def test_the_gradient_goes_through_the_same_mask():
    torch.manual_seed(1)
    x = (torch.rand(64, 24, 32) + 0.5).requires_grad_()  # no zeros: the output shows the mask
    grad = torch.randn(64, 24, 32)
    out = dropout(x, 0.1)
    out.backward(grad)
    kept = out != 0
    assert torch.equal(out, torch.where(kept, x * scale(0.1), 0.0).detach())
    torch.testing.assert_close(x.grad, torch.where(kept, grad * scale(0.1), 0.0))


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
    module = CPUDropout(0.5).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), F.dropout(x, 1.0))
    assert CPUDropout(0.3).state_dict() == {}
    assert CPUDropout(0.3).extra_repr() == torch.nn.Dropout(0.3).extra_repr()
