"""`aiayn.kernels.linear`: float32 CPU products on oneDNN equal `F.linear` (forward and every
gradient, in float64 as the reference), and everything it must not take goes to `F.linear`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.kernels import linear as module
from aiayn.kernels.linear import CPULinear, linear

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the products that went to oneDNN, which is on whatever this CPU is."""
    seen: list[tuple[int, ...]] = []
    product = module.onednn_product

    def counted(x, weight, bias=None):
        seen.append((*x.shape, weight.size(0)))
        return product(x, weight, bias)

    monkeypatch.setattr(module, "onednn_product", counted)
    monkeypatch.setattr(module, "ENABLED", True)
    return seen


@pytest.mark.parametrize(
    ("setting", "vendor", "flags", "chosen"),
    [
        (None, "AuthenticAMD", ["avx2", "avx512f", "fma"], True),  # MKL's AVX2 path: the slower
        ("auto", "AuthenticAMD", ["avx2", "avx512f"], True),
        (None, "AuthenticAMD", ["avx2", "fma"], False),  # AVX2 only: MKL as fast or faster
        (None, "GenuineIntel", ["avx2", "avx512f", "amx_tile"], False),  # Intel: MKL's own
        ("", "", [], False),  # no /proc/cpuinfo
        ("1", "GenuineIntel", ["avx2"], True),
        ("0", "AuthenticAMD", ["avx2", "avx512f"], False),
    ],
)
def test_onednn_is_chosen_where_mkl_lags_it_or_as_forced(
    setting: str | None, vendor: str, flags: list[str], chosen: bool
) -> None:
    assert module.use_onednn(setting, vendor, flags) is chosen


def test_a_misspelt_setting_warns_and_decides_by_the_cpu() -> None:
    with pytest.warns(UserWarning, match="AIAYN_ONEDNN='yes' is not 1"):
        assert module.use_onednn("yes", "AuthenticAMD", ["avx512f"]) is True


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("in_features", "out_features"), [(16, 40), (40, 16)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_forward_and_gradients_equal_f_linear(
    bias: bool, in_features: int, out_features: int, contiguous: bool, calls: list
) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 7, in_features) if contiguous else torch.randn(7, 3, in_features)
    x = (x if contiguous else x.transpose(0, 1)).requires_grad_()
    weight = torch.randn(out_features, in_features, requires_grad=True)
    b = torch.randn(out_features, requires_grad=True) if bias else None
    grad = torch.randn(3, 7, out_features)
    out = linear(x, weight, b)
    out.backward(grad)
    assert len(calls) == 3  # the forward product and both backward products
    ref_x, ref_w = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    ref_b = b.detach().double().requires_grad_() if bias else None
    ref = F.linear(ref_x, ref_w, ref_b)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), ref_w.grad, rtol=1e-5, atol=1e-5)
    assert weight.grad.is_contiguous()
    if bias:
        torch.testing.assert_close(b.grad.double(), ref_b.grad, rtol=1e-5, atol=1e-5)


def test_a_tied_weight_sums_its_gradients(calls: list) -> None:
    """The output layer shares the embedding's weight: both uses' gradients add up."""
    torch.manual_seed(0)
    weight = torch.randn(11, 8, requires_grad=True)
    tokens = torch.tensor([[1, 4, 9]])
    (linear(F.embedding(tokens, weight), weight) ** 2).sum().backward()
    mine = weight.grad.clone()
    weight.grad = None
    (F.linear(F.embedding(tokens, weight), weight) ** 2).sum().backward()
    torch.testing.assert_close(mine, weight.grad, rtol=1e-5, atol=1e-5)
    assert calls


def test_inference_skips_autograd_and_the_module_keeps_nn_linears_state(calls: list) -> None:
    layer = CPULinear(8, 5)
    plain = torch.nn.Linear(8, 5)
    plain.load_state_dict(layer.state_dict())
    assert layer.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-6)
    assert calls == [(6, 8, 5)]


def test_what_onednn_must_not_take_goes_to_f_linear(calls: list, monkeypatch) -> None:
    weight, x = torch.randn(5, 8), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16-mixed: autocast decides
        assert linear(x, weight).dtype == torch.bfloat16
    assert linear(x.double(), weight.double()).dtype == torch.float64
    assert linear(torch.randn(0, 8), weight).shape == (0, 5)
    with torch.backends.mkldnn.flags(enabled=False):
        linear(x, weight)
    assert calls == []
    monkeypatch.setattr(module, "ENABLED", False)  # what AIAYN_ONEDNN=0 (or the CPU) sets
    linear(x, weight)
    assert calls == []


def test_the_output_takes_in_place_operations(calls: list) -> None:
    """Callers may add a residual or a mask in place, with gradients as for ``F.linear``."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, requires_grad=True)
    weight = torch.randn(5, 8, requires_grad=True)
    out = linear(x, weight)
    out.mul_(2).add_(1)
    out.square().sum().backward()
    ref_x, ref_w = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    (F.linear(ref_x, ref_w) * 2 + 1).square().sum().backward()
    torch.testing.assert_close(out, (F.linear(x, weight) * 2 + 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, ref_w.grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        linear(x, weight).add_(1)  # the inference path too


def test_double_backward_equals_f_linear(calls: list) -> None:
    """A gradient penalty differentiates the backward pass: ``create_graph=True`` must give
    F.linear's second derivatives, not silently drop them."""
    torch.manual_seed(0)

    def penalty(op, x, weight, bias):
        out = torch.tanh(op(x, weight, bias))
        grad_x, grad_w = torch.autograd.grad(out.square().sum(), (x, weight), create_graph=True)
        return grad_x.square().sum() + grad_w.square().sum()

    leaves = [torch.randn(4, 6).double(), torch.randn(3, 6).double(), torch.randn(3).double()]
    mine = [t.float().requires_grad_() for t in leaves]
    ref = [t.clone().requires_grad_() for t in leaves]
    value, ref_value = penalty(linear, *mine), penalty(F.linear, *ref)
    value.backward()
    ref_value.backward()
    assert calls  # the first-order products went to oneDNN
    torch.testing.assert_close(value.double(), ref_value, rtol=1e-5, atol=1e-5)
    for got, want in zip(mine, ref, strict=True):
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"d_embed": 8, "norm_first": True}])
def test_the_transformer_on_onednn_equals_it_on_f_linear(overrides: dict, monkeypatch) -> None:
    """The model's logits and every parameter's gradient are the same whichever library
    this CPU's default picks (the model-level proofs run on that default)."""
    from tests.model.model_helpers import random_tokens, tiny_model

    src, tgt = random_tokens(3, 9, 23, seed=2), random_tokens(3, 7, 23, seed=3)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(module, "ENABLED", enabled)
        model = tiny_model(**overrides)
        logits = model(src, tgt)
        logits.logsumexp(-1).sum().backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (mine, mine_grads), (ref, ref_grads) = results
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
    assert mine_grads.keys() == ref_grads.keys()
    for name, grad in mine_grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_the_output_layer_decodes_on_onednn_on_amd_whatever_the_cpus_default(
    calls: list, monkeypatch
) -> None:
    """Without gradients (decoding) the output layer's few rows x whole vocabulary go to
    oneDNN on an AMD CPU even where the CPU's default is MKL; in training it follows the
    default; an explicit ``onednn=False``, or AIAYN_ONEDNN=0, never takes oneDNN."""
    monkeypatch.setattr(module, "ENABLED", False)
    monkeypatch.setattr(module, "DECODE_ONEDNN", True)  # an AMD CPU
    layer = module.CPUOutputProjection(8, 50)
    layer.reset_parameters()
    x = torch.randn(2, 1, 8)
    with torch.no_grad():
        decoded = layer(x)
    assert calls == [(2, 8, 50)]
    trained = layer(x)
    assert len(calls) == 1  # training: MKL, this CPU's default here
    torch.testing.assert_close(decoded, trained.detach(), rtol=1e-5, atol=1e-6)
    linear(x, layer.weight.detach(), onednn=False)
    assert len(calls) == 1
    linear(x, layer.weight.detach(), onednn=True)
    assert len(calls) == 2
    monkeypatch.setattr(module, "MKL_FORCED", True)  # AIAYN_ONEDNN=0: MKL everywhere
    with torch.no_grad():
        torch.testing.assert_close(layer(x), decoded, rtol=1e-5, atol=1e-6)
    assert len(calls) == 2


def test_on_intel_the_output_layer_decodes_on_the_cpus_default(calls: list, monkeypatch) -> None:
    """On an Intel CPU MKL is as fast for a decoding step's output layer: it keeps MKL."""
    from aiayn.model.embedding import OutputProjection

    monkeypatch.setattr(module, "ENABLED", False)
    monkeypatch.setattr(module, "DECODE_ONEDNN", False)
    layer = OutputProjection(8, 50)
    layer.reset_parameters()
    with torch.no_grad():
        layer(torch.randn(2, 1, 8))
    assert calls == []


@pytest.mark.parametrize(
    ("vendor", "chosen"), [("AuthenticAMD", True), ("GenuineIntel", False), ("", False)]
)
def test_decoding_prefers_onednn_on_amd_cpus_only(vendor: str, chosen: bool) -> None:
    assert module.decode_on_onednn(vendor) is chosen
