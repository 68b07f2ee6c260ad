"""`projected_label_smoothed_loss`: the output layer fused into the loss, its logits built a
block of rows at a time, equals the loss of the whole logits in value and in every gradient."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from aiayn.data.dataset import collate
from aiayn.kernels import loss as loss_module
from aiayn.kernels.machine import bf16_native
from aiayn.model import ModelConfig, build_model
from aiayn.model.embedding import OutputProjection
from aiayn.training import loss as training_loss
from aiayn.training.loss import label_smoothed_loss, product_dtype, projected_label_smoothed_loss
from aiayn.training.module import TranslationModule

V, D = 23, 12
TARGET = torch.tensor([[4, 5, 6, 0, 0, 0, 0], [7, 8, 9, 10, 2, 22, 1], [3, 3, 3, 3, 3, 3, 0]])


def output_layer(bias: bool, d_embed: int | None, dtype: torch.dtype) -> OutputProjection:
    torch.manual_seed(0)
    output = OutputProjection(D, V, d_embed, bias).to(dtype)
    output.reset_parameters()
    if bias:
        torch.nn.init.normal_(output.bias)
    return output


def loss_and_grads(loss_fn, features, output, scale=2.5):
    """(loss, nll, d(scale * loss)/d features, then each parameter of `output`)."""
    for tensor in (features, *output.parameters()):
        tensor.grad = None
    loss, nll = loss_fn()
    (scale * loss).backward()
    grads = [features.grad, *(p.grad for p in output.parameters())]
    return [loss.detach(), nll, *(g.clone() for g in grads)]


def fused_and_whole(features, output, rows=4):
    """`loss_and_grads` of the blocked loss (blocks of `rows`) and of `label_smoothed_loss`
    over the whole logits, on `TARGET` with ε = 0.1."""
    fused = loss_and_grads(
        lambda: projected_label_smoothed_loss(features, output, TARGET, 0.1, rows=rows),
        features,
        output,
    )
    whole = loss_and_grads(
        lambda: label_smoothed_loss(output(features), TARGET, 0.1), features, output
    )
    return fused, whole


@pytest.mark.parametrize("rows", [1, 4, 256])
@pytest.mark.parametrize(("bias", "d_embed"), [(False, None), (True, None), (False, 5), (True, 5)])
def test_blocks_give_the_loss_and_gradients_of_the_whole_logits(bias, d_embed, rows):
    """float64, blocks of 1, 4 (the last one short: 21 rows) and 256 rows (one block): the
    loss, the NLL and the gradients of the features, the output matrix, its bias and the
    factorized projection equal those of `label_smoothed_loss` over `output(features)`, and
    torch's cross-entropy; an upstream gradient of 2.5 scales them all."""
    output = output_layer(bias, d_embed, torch.float64)
    features = (3 * torch.randn(3, 7, D, dtype=torch.float64)).requires_grad_()
    fused, whole = fused_and_whole(features, output, rows)
    assert len(fused) == len(whole) == 4 + bias + (d_embed is not None)
    for ours, reference in zip(fused, whole, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-13)
    logits = output(features).view(-1, V)
    torch_loss = F.cross_entropy(logits, TARGET.view(-1), ignore_index=0, label_smoothing=0.1)
    torch.testing.assert_close(fused[0], torch_loss.detach(), rtol=1e-12, atol=0)
    assert fused[2][0, 3:].abs().sum() == 0  # padding rows get no gradient


def test_float32_blocks_match_the_whole_logits():
    """float32, tied to nothing, blocks of 4: within float32 rounding of the whole logits."""
    output = output_layer(False, None, torch.float32)
    features = (3 * torch.randn(3, 7, D)).requires_grad_()
    fused, whole = fused_and_whole(features, output)
    for ours, reference in zip(fused, whole, strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-7)


def test_gradcheck_and_a_confident_model():
    """gradcheck through the features, the output matrix and its bias in float64; logits 100x
    as large (a model sure of wrong tokens): the NLL is torch's, finite and large."""
    output = output_layer(True, None, torch.float64)
    features = torch.randn(3, 7, D, dtype=torch.float64, requires_grad=True)
    weight = output.weight.detach().clone().requires_grad_()
    bias = output.bias.detach().clone().requires_grad_()

    def loss(f, w, b):
        layer = SimpleNamespace(proj=None, weight=w, bias=b)
        return projected_label_smoothed_loss(f, layer, TARGET, 0.2, rows=5)[0]

    assert torch.autograd.gradcheck(loss, (features, weight, bias))
    big = 100 * features.detach()
    _, nll = projected_label_smoothed_loss(big, output, TARGET, 0.1, rows=5)
    reference = F.cross_entropy(output(big).view(-1, V), TARGET.view(-1), ignore_index=0)
    assert torch.isfinite(nll) and nll > 100
    torch.testing.assert_close(nll, reference.detach(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "frozen"])
def test_without_gradients_the_loss_is_the_same(mode):
    """Under no_grad / inference_mode (validation) or with nothing requiring gradients the
    blocks only reduce the logits: the same loss and NLL, no gradient kept."""
    output = output_layer(True, None, torch.float64)
    features = torch.randn(3, 7, D, dtype=torch.float64)
    expected = label_smoothed_loss(output(features), TARGET, 0.1)
    if mode == "frozen":
        output.requires_grad_(False)
        got = projected_label_smoothed_loss(features, output, TARGET, 0.1, rows=4)
    else:
        with getattr(torch, mode)():
            got = projected_label_smoothed_loss(features, output, TARGET, 0.1, rows=4)
    assert not got[0].requires_grad
    for ours, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, reference.detach(), rtol=1e-12, atol=0)


def test_backward_twice_with_retained_graph_gives_the_same_gradients():
    output = output_layer(False, None, torch.float64)
    features = torch.randn(3, 7, D, dtype=torch.float64, requires_grad=True)
    loss, _ = projected_label_smoothed_loss(features, output, TARGET, 0.1, rows=4)
    loss.backward(retain_graph=True)
    first = features.grad.clone()
    features.grad = None
    loss.backward()
    torch.testing.assert_close(features.grad, first, rtol=0, atol=0)


def test_where_the_blocks_apply_and_in_which_dtype():
    """CPU tensors of one dtype: their own products in float32, float64 and bfloat16, bf16
    under bf16 autocast (bf16-mixed); float16 and empty batches build the logits whole."""
    x, w = torch.randn(4, D), torch.nn.Parameter(torch.randn(V, D))
    assert product_dtype(x, w) == torch.float32
    assert product_dtype(x.double(), w.double()) == torch.float64
    assert product_dtype(x.bfloat16(), w.bfloat16()) == torch.bfloat16
    assert product_dtype(x.half(), w.half()) is None
    assert product_dtype(x[:0], w) is None
    assert product_dtype(x.double(), w) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert product_dtype(x, w) == torch.bfloat16
        assert product_dtype(x.double(), w.double()) == torch.float64


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("how", ["bf16 autocast", "bf16 weights"])
def test_bfloat16_blocks_match_the_whole_logits_to_bfloat16_rounding(how, bias):
    """bf16 products (bf16-mixed's autocast, or bf16 weights), softmax in float32: the loss
    and every gradient are the whole logits' (autocast or bf16 the same way) to bfloat16
    rounding, and the float32 ones to a little more."""
    output = output_layer(bias, None, torch.float32)
    features = (3 * torch.randn(3, 7, D)).requires_grad_()
    exact = loss_and_grads(
        lambda: label_smoothed_loss(output(features), TARGET, 0.1), features, output
    )
    if how == "bf16 weights":
        output.bfloat16()
        features = features.detach().bfloat16().requires_grad_()
        context = torch.autocast("cpu", enabled=False)
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)
    with context:
        fused, whole = fused_and_whole(features, output)
    assert fused[2].dtype == features.dtype and fused[3].dtype == output.weight.dtype
    for ours, theirs, reference in zip(fused, whole, exact, strict=True):
        scale = reference.abs().max().item()
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=0.02 * scale)
        torch.testing.assert_close(ours.float(), reference, rtol=0, atol=0.03 * scale)


def test_bfloat16_gradients_of_a_confident_model_are_relative_to_the_gradient():
    """An output matrix of orthonormal rows and features pointing at their targets' rows
    (softmax one-hot to ~1e-4, no smoothing), under bf16 autocast: the gradient of the logits
    is formed in float32 and rounded to bf16 only as a whole, so the error in the features'
    and the matrix's gradients stays small against those gradients (here ~1e-4 of the
    weights), where subtracting the one-hot after the bf16 products would leave the weights'
    own rounding (~2e-3 of them) in every row."""
    torch.manual_seed(0)
    output = OutputProjection(32, V)
    with torch.no_grad():
        output.weight.copy_(torch.linalg.qr(torch.randn(32, 32))[0][:V])
    target = TARGET.clamp(min=1)
    features = (12 * output.weight.detach()[target]).requires_grad_()
    exact = loss_and_grads(
        lambda: projected_label_smoothed_loss(features, output, target, 0.0), features, output
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = loss_and_grads(
            lambda: projected_label_smoothed_loss(features, output, target, 0.0, rows=4),
            features,
            output,
        )
    assert exact[2].abs().max() < 1e-3 * output.weight.abs().max() / len(target.view(-1))
    for ours, reference in zip(fused[2:], exact[2:], strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0.2 * reference.abs().max())


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_features_only_is_the_output_layers_input(arch):
    config = ModelConfig(
        arch=arch, src_vocab_size=V, tgt_vocab_size=V, d_model=16, num_heads=2, d_ff=32
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    src, tgt = torch.randint(3, V, (2, 6)), torch.randint(3, V, (2, 5))
    src[0, 4:] = tgt[1, 3:] = config.pad_id
    features = model(src, tgt, features_only=True)
    assert features.shape == (2, 5, 16)
    torch.testing.assert_close(model.output(features), model(src, tgt), rtol=0, atol=0)


MODELS = {
    "tied": {},
    "untied": {"share_embeddings": "none"},
    "factorized": {"d_embed": 8},
    "rnn": {"arch": "rnn"},
}


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_modules_update_has_the_gradients_of_the_whole_logits(model, precision, monkeypatch):
    """`TranslationModule.losses` takes the blocked path (spied on) and gives every parameter
    the gradient that the whole logits give (`product_dtype` forced to None), on a padded
    batch: tied output matrix or not, factorized output, the LSTM; in float32 and under
    bf16-mixed's autocast (where the LSTM's and the factorized projection's features are
    bf16 and the output matrix float32), to that precision's rounding."""
    if model == "rnn" and precision == "bf16-mixed" and not bf16_native("cpu"):
        pytest.skip("oneDNN has no bf16 LSTM on a CPU without native bf16 (train.py refuses it)")
    config = ModelConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=16,
        num_heads=2,
        d_ff=32,
        dropout=0.0,
        **MODELS[model],
    )
    torch.manual_seed(0)
    module = TranslationModule(config.__dict__, {"label_smoothing": 0.1}, {}, val_bleu=False)
    rows = torch.randint(4, V, (3, 9)).tolist()
    batch = collate([(i, row[: 4 + 2 * i], row[: 9 - 2 * i]) for i, row in enumerate(rows)])
    assert batch.tgt_out.eq(config.pad_id).any()
    calls = []
    forward = loss_module._ProjectedLabelSmoothedCE.forward
    monkeypatch.setattr(
        loss_module._ProjectedLabelSmoothedCE,
        "forward",
        staticmethod(lambda *a: calls.append(1) or forward(*a)),
    )

    def gradients():
        module.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss, _ = module.losses(batch)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in module.named_parameters()}

    fused_loss, fused = gradients()
    assert calls == [1]
    monkeypatch.setattr(training_loss, "product_dtype", lambda x, w: None)
    whole_loss, whole = gradients()
    assert calls == [1]
    assert fused.keys() == whole.keys()
    if precision == "32-true":
        torch.testing.assert_close(fused_loss, whole_loss, rtol=1e-6, atol=0)
        for name in fused:
            torch.testing.assert_close(fused[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)
        return
    torch.testing.assert_close(fused_loss, whole_loss, rtol=1e-2, atol=0)
    for name in fused:  # bf16 products: to a few bf16 roundings of each gradient's scale
        scale = whole[name].abs().max().item()
        torch.testing.assert_close(fused[name], whole[name], rtol=0, atol=0.05 * scale, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_gpu_path_pads_to_equal_blocks_and_keeps_the_loss_and_gradients(
    dtype, bias, monkeypatch
):
    """`kernels=gpu`'s path (CPU tensors let in): the 21 rows padded to 24, in `GPU_BLOCKS`
    equal blocks, give the whole logits' loss and gradients; in float16 products under a
    GradScaler's scale of 65 536, each row's gradient is formed unscaled and unnormalised,
    so none underflows, and the result equals float32 within float16's precision."""
    from aiayn import kernels

    monkeypatch.setattr(loss_module, "GPU_DEVICES", ("cuda", "cpu"))
    precise = torch.float64 if dtype == torch.float64 else torch.float32
    output = output_layer(bias, None, precise)
    features = torch.randn(3, 7, D, dtype=precise, requires_grad=True)
    seen = []
    apply = loss_module._ProjectedLabelSmoothedCE.apply
    monkeypatch.setattr(
        loss_module._ProjectedLabelSmoothedCE,
        "apply",
        lambda x, *rest: seen.append((x.size(0), rest[5])) or apply(x, *rest),
    )
    kernels.use("gpu")
    try:
        products = product_dtype(features.to(dtype), output.weight.to(dtype))
        assert products == dtype
        fused = loss_and_grads(
            lambda: loss_module.blocked_projected_loss(
                features, output, TARGET, 0.1, 0, None, dtype
            ),
            features,
            output,
            scale=65536.0,
        )
    finally:
        kernels.use("cpu")
    assert seen == [(24, loss_module.GPU_BLOCKS)]  # 21 rows padded to 3 rows a block
    whole = loss_and_grads(
        lambda: label_smoothed_loss(output(features), TARGET, 0.1), features, output, 65536.0
    )
    tolerance = {} if dtype == torch.float64 else {"rtol": 5e-3, "atol": 5e-3 * 65536 / 21}
    for got, want in zip(fused, whole, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tolerance)
