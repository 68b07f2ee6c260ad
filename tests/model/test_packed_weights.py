"""`aiayn.kernels.linear.packed_weights`: inference products on MKL-packed weights equal
`F.linear` for any row count and read the packed copy, never serve a pass that takes gradients
or a weight that changed, and decoding with them gives the translations decoded without
them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import random_tokens, tiny_config, tiny_model

from aiayn.kernels import accelerate
from aiayn.kernels import linear as module
from aiayn.kernels.linear import CPULinear, packed_weights
from aiayn.model import DecodeConfig, build_model, generate
from aiayn.model.ensemble import Ensemble

pytestmark = pytest.mark.skipif(not module.MKL_PACKING, reason="this torch cannot pack")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The (rows, out_features) of the products that ran on packed weights; packing on
    whatever this CPU is, products on MKL."""
    seen: list[tuple[int, ...]] = []
    product = module.packed_product

    def counted(x, packed, weight, bias):
        seen.append((x.size(0), weight.size(0)))
        return product(x, packed, weight, bias)

    monkeypatch.setattr(module, "packed_product", counted)
    monkeypatch.setattr(module, "PACKING", True)
    monkeypatch.setattr(module, "ENABLED", False)
    monkeypatch.setattr(module, "DECODE_ONEDNN", False)
    return seen


@pytest.mark.parametrize(
    ("setting", "vendor", "chosen"),
    [
        (None, "GenuineIntel", True),
        ("auto", "GenuineIntel", True),
        (None, "AuthenticAMD", False),  # not measured there
        ("", "", False),
        ("1", "AuthenticAMD", True),
        ("0", "GenuineIntel", False),
    ],
)
def test_packing_is_on_for_intel_cpus_or_as_forced(
    setting: str | None, vendor: str, chosen: bool
) -> None:
    assert module.use_packing(setting, vendor) is chosen


def test_a_misspelt_setting_warns_and_decides_by_the_cpu() -> None:
    with pytest.warns(UserWarning, match="AIAYN_PACK_WEIGHTS='yes' is not 1"):
        assert module.use_packing("yes", "GenuineIntel") is True


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 4, 5, 64, 200])  # packed for 64 rows: any count is served
@pytest.mark.parametrize(("in_features", "out_features"), [(40, 72), (72, 40)])
def test_packed_products_equal_f_linear_for_any_row_count(
    bias: bool, rows: int, in_features: int, out_features: int, calls: list
) -> None:
    """From `PACKED_MIN_ROWS` (4) rows on, the packed copy; below, the weight itself."""
    torch.manual_seed(rows)
    layer = CPULinear(in_features, out_features, bias=bias)
    x = torch.randn(in_features, rows).t()  # (rows, K), not contiguous
    with torch.no_grad(), packed_weights(layer):
        out = layer(x)
        batched = layer(x.expand(2, rows, in_features))  # (B, T, K) -> B * T rows
    packed = [(n, out_features) for n in (rows, 2 * rows) if n >= module.PACKED_MIN_ROWS]
    assert calls == packed
    want = F.linear(x.double(), layer.weight.double(), None if not bias else layer.bias.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched, out.expand(2, rows, out_features))


@pytest.mark.parametrize("rows", [1, 7, 64, 130])
def test_the_product_reads_the_packed_copy_not_the_weight(rows: int) -> None:
    """Given zeros as the weight and the packed copy of another, the product is that of the
    packed copy: MKL computed it, with no fallback to the weight (torch's op falls back to
    ``F.linear`` on the weight when told a row count other than the one packed for)."""
    weight, x = torch.randn(24, 16), torch.randn(rows, 16)
    packed = module.pack(weight)
    assert packed is not None
    out = module.packed_product(x, packed.tensor, torch.zeros_like(weight), None)
    torch.testing.assert_close(out, x @ weight.T, rtol=1e-5, atol=1e-5)


def test_the_packed_copies_exist_only_inside_the_block(calls: list) -> None:
    layer = module.CPUOutputProjection(8, 50)
    layer.reset_parameters()
    x = torch.randn(4, 1, 8)
    assert layer.packed is None
    with torch.inference_mode():
        with packed_weights(layer):
            assert layer.packed is not None
            inside = layer(x)
        assert layer.packed is None
        outside = layer(x)
    assert calls == [(4, 50)]
    torch.testing.assert_close(inside, outside, rtol=1e-6, atol=1e-6)


def test_nothing_is_packed_where_packing_is_off(calls: list, monkeypatch) -> None:
    monkeypatch.setattr(module, "PACKING", False)
    layer = CPULinear(8, 6)
    with torch.no_grad(), packed_weights(layer):
        assert layer.packed is None
        layer(torch.randn(2, 8))
    assert calls == []


def test_a_pass_that_takes_gradients_uses_the_weights_themselves(calls: list) -> None:
    layer = CPULinear(8, 6)
    x = torch.randn(4, 8)
    with packed_weights(layer):
        out = layer(x)
        out.sum().backward()
    assert calls == []
    assert layer.weight.grad is not None
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(6, 8))


@pytest.mark.parametrize("change", ["in place", "new data", "new parameter"])
def test_a_weight_changed_inside_the_block_is_not_read_from_its_old_copy(
    change: str, calls: list
) -> None:
    layer = CPULinear(8, 6)
    x = torch.randn(4, 8)
    with torch.no_grad(), packed_weights(layer):
        layer(x)
        if change == "in place":
            layer.weight.add_(1.0)  # moves the weight's version counter
        elif change == "new data":
            layer.weight.data = layer.weight + 1.0  # other memory, the same Parameter
        else:
            layer.weight = torch.nn.Parameter(layer.weight + 1.0)  # another tensor
        changed = layer(x)
    assert len(calls) == 1
    torch.testing.assert_close(changed, F.linear(x, layer.weight, layer.bias))


def test_packed_products_take_precedence_over_onednn_where_forced(calls: list, monkeypatch):
    """AIAYN_PACK_WEIGHTS=1 on a CPU whose products go to oneDNN (an AMD CPU with AVX-512):
    decoding runs on the packed copies; training and torch's oneDNN switch keep oneDNN."""
    monkeypatch.setattr(module, "ENABLED", True)
    onednn: list[int] = []
    product = module.onednn_product
    monkeypatch.setattr(module, "onednn_product", lambda *a: onednn.append(1) or product(*a))
    layer = CPULinear(8, 6)
    x = torch.randn(4, 8)
    with packed_weights(layer):
        with torch.no_grad():
            layer(x)
            with torch.backends.mkldnn.flags(enabled=False):
                layer(x)
        layer(x.requires_grad_())
    assert len(calls) == 1 and len(onednn) == 1


def test_an_inner_block_packs_nothing_anew_and_leaves_the_outer_copies(
    calls: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = accelerate(tiny_model(), "cpu")
    packs: list[int] = []
    pack = module.pack
    monkeypatch.setattr(module, "pack", lambda weight: packs.append(1) or pack(weight))
    layers = [m for m in model.modules() if isinstance(m, module.PackableMixin)]
    with packed_weights(model):
        assert len(packs) == len(layers) > 0
        with packed_weights(model):
            pass
        assert len(packs) == len(layers)
        assert all(m.packed is not None for m in layers)
    assert all(m.packed is None for m in layers)


def test_weights_that_are_not_float32_are_not_packed(calls: list) -> None:
    layer = CPULinear(8, 6).to(torch.bfloat16)
    with torch.no_grad(), packed_weights(layer):
        assert layer.packed is None
        out = layer(torch.randn(2, 8, dtype=torch.bfloat16))
    assert calls == [] and out.dtype == torch.bfloat16


def _models() -> dict[str, torch.nn.Module]:
    """Each on the CPU kernels (`accelerate`), whose layers pack."""
    rnn = build_model(tiny_config(arch="rnn", d_model=16, num_heads=1)).eval()
    models = {
        "base": tiny_model(),
        "factorized, pre-norm, output bias": tiny_model(
            d_embed=8, norm_first=True, output_bias=True
        ),
        "ensemble": Ensemble([tiny_model(), tiny_model(seed=1)]),
        "rnn": rnn,
    }
    return {name: accelerate(model, "cpu") for name, model in models.items()}


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("name", list(_models()))
def test_decoding_on_packed_weights_gives_the_same_translations(
    strategy: str, name: str, calls: list
) -> None:
    """Every product of the encoder, each decoder step and the output layer that `linear`
    computes runs on the packed copies, and the hypotheses and scores are those of the
    weights themselves."""
    model = _models()[name]
    src = random_tokens(4, 9, 23, seed=4)
    src[1, 6:] = 0  # padding: sentences of different lengths
    config = DecodeConfig(strategy=strategy, beam_size=3, nbest=2 if strategy == "beam" else 1)
    plain = generate(model, src, config)
    assert calls == []  # generate alone does not pack
    with packed_weights(model):
        packed = generate(model, src, config)
    layers = [m for m in model.modules() if isinstance(m, module.PackableMixin)]
    assert len(calls) > len(layers) > 0  # the decoder steps' products ran on the copies
    assert {out for _, out in calls} == {m.weight.size(0) for m in layers}
    for mine, want in zip(packed, plain, strict=True):
        assert [h.tokens for h in mine] == [h.tokens for h in want]
        for a, b in zip(mine, want, strict=True):
            assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-6)
