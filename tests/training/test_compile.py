"""`compile=true`: the whole training loss (the model, the output layer and the loss, forward
and backward) compiles as one graph, with no graph break, for every model variant that a
shipped config builds, on the GPU's path (`kernels=gpu`: the blocked output-layer loss with a
constant number of blocks), and gives the eager loss and gradients. Traced on the CPU with
the ``aot_eager`` backend (Dynamo and AOTAutograd, as inductor gets them; no code generation),
with shapes that change from call to call, as a run's batches do."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
import yaml

from aiayn import kernels
from aiayn.kernels import loss as kernel_loss
from aiayn.model import ModelConfig
from aiayn.training.module import TranslationModule

CONF = Path(__file__).resolve().parents[2] / "conf"
NAMES = {f.name for f in fields(ModelConfig)}
SIZES = {"src_vocab_size": 50, "tgt_vocab_size": 50, "d_ff": 24, "max_positions": 64}
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout", "embedding_dropout")


def _small(values: dict) -> ModelConfig:
    """A shipped model config at a test's size, its structure kept (placement of norms and
    dropout, positions, heads and their width, embedding options, tying)."""
    values = {k: v for k, v in values.items() if k in NAMES}
    values.update(SIZES, num_heads=2, d_model=8)
    for name in DROPOUTS:  # whether there is a dropout is structure, its rate is not
        if values.get(name):
            values[name] = 0.1
    if values.get("head_dim") is not None:
        values["head_dim"] = 4
    if values.get("d_embed"):
        values["d_embed"] = 8
    for side in ("num_encoder_layers", "num_decoder_layers"):
        values[side] = min(1, values.get(side, 1))
    return ModelConfig(**values)


def _variants() -> dict[str, ModelConfig]:
    """Every distinct Transformer structure among conf/model/*.yaml and the ablations over
    `model=base` (the LSTM baseline is refused with compile=true: `test_compile_is_...`)."""
    base = yaml.safe_load((CONF / "model" / "base.yaml").read_text()) or {}
    found: dict[str, ModelConfig] = {}
    for path in sorted((CONF / "model").glob("*.yaml")):
        found[f"model={path.stem}"] = _small(yaml.safe_load(path.read_text()) or {})
    for path in sorted((CONF / "ablation").glob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model", {})
        found[f"ablation={path.stem}"] = _small({**base, **model})
    distinct: dict[str, ModelConfig] = {}
    for name, config in found.items():
        if config.arch == "transformer" and config not in distinct.values():
            distinct[name] = config
    return distinct


VARIANTS = _variants()


def _batch(size: int, src_len: int, tgt_len: int) -> tuple[torch.Tensor, ...]:
    """Token ids with right padding (0) in the last rows, as `aiayn.data` pads."""
    src = torch.randint(4, 50, (size, src_len))
    tgt = torch.randint(4, 50, (size, tgt_len + 1))
    src[-1, src_len // 2 :] = 0
    tgt[-1, tgt_len // 2 :] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def _module(config: ModelConfig) -> TranslationModule:
    torch.manual_seed(0)
    optim = {"schedule": "inverse_sqrt", "lr": 1e-3, "warmup_steps": 10}
    return TranslationModule(asdict(config), optim, {})


@pytest.fixture
def gpu_loss(monkeypatch):
    """The GPU's policy (`kernels=gpu`), its blocked loss taking CPU tensors too."""
    monkeypatch.setattr(kernel_loss, "GPU_DEVICES", ("cuda", "cpu"))
    kernels.use("gpu")
    yield
    kernels.use("cpu")
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_whole_training_loss_compiles_without_graph_breaks(name, gpu_loss):
    """Dynamo traces the training pass (dropout on) of each variant as one graph
    (``fullgraph=True`` raises at a break), once for batches of changing shapes."""
    module = _module(VARIANTS[name]).train()
    compiled = torch.compile(module._losses, backend="eager", fullgraph=True, dynamic=True)
    for shape in [(4, 7, 6), (3, 9, 5)]:
        loss, _ = compiled(*_batch(*shape))
        loss.backward()
        assert torch.isfinite(loss)
    assert all(p.grad is not None for p in module.parameters())


def test_the_compiled_loss_gives_the_eager_loss_and_gradients(gpu_loss):
    """Through AOTAutograd (what inductor compiles, forward and backward), the compiled loss
    of the base structure equals the eager one, padding included (no dropout)."""
    module = _module(VARIANTS["model=base"]).eval()
    compiled = torch.compile(module._losses, backend="aot_eager", fullgraph=True)
    batch = _batch(5, 8, 7)
    results = []
    for losses in (compiled, module._losses):
        module.zero_grad()
        loss, nll = losses(*batch)
        loss.backward()
        grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
        results.append((loss.detach(), nll, grads))
    (a_loss, a_nll, a_grads), (b_loss, b_nll, b_grads) = results
    torch.testing.assert_close(a_loss, b_loss)
    torch.testing.assert_close(a_nll, b_nll)
    assert len(a_grads) == len(b_grads) == len(list(module.parameters()))
    for a, b in zip(a_grads, b_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_compile_resolves_by_device_and_refuses_the_lstm_baseline():
    """compile=null resolves by `COMPILE_WINS` (off on CUDA and the CPU, each for its recorded
    reason); an explicit value wins; the LSTM baseline is refused in one line, before any
    work."""
    from aiayn.errors import ConfigError
    from aiayn.kernels.compiled import COMPILE_WINS, resolve_compile

    assert resolve_compile(None, "cuda", "transformer") is COMPILE_WINS["cuda"]
    assert resolve_compile(None, "cpu", "transformer") is False
    assert resolve_compile(None, "mps", "transformer") is False
    assert resolve_compile(False, "cuda", "transformer") is False
    assert resolve_compile(True, "cpu", "transformer") is True
    assert resolve_compile(None, "cuda", "rnn") is False
    with pytest.raises(ConfigError, match="compile=false"):
        resolve_compile(True, "cuda", "rnn")


@pytest.mark.slow  # inductor generates and builds C++ for both passes: most of a minute
def test_a_compiled_run_records_it_and_trains(tmp_path):
    """`compile=true` on the CPU: a real run through Lightning runs its training and
    validation losses through compiled graphs (Dynamo counts them; the model's own forward,
    which decoding uses, stays eager) and records `compile` in metrics.json."""
    import json

    from torch._dynamo.utils import counters

    from aiayn.training.run import run
    from tests.helpers import compose_train

    overrides = ["model=tiny", "trainer.max_steps=2", "trainer.max_epochs=-1", "test=false"]
    overrides += ["trainer.val_check_interval=2", "trainer.check_val_every_n_epoch=null"]
    overrides += ["~callbacks.rich_progress_bar", "kernels=torch", "compile=true"]
    counters.clear()
    try:
        metrics = run(compose_train(overrides, output_dir=tmp_path / "on"))
        graphs = counters["stats"]["unique_graphs"]
    finally:
        kernels.use("cpu")  # run() set the process's policy
        torch._dynamo.reset()
    assert graphs >= 2  # the training pass and the validation pass (no gradients)
    assert json.loads((tmp_path / "on" / "metrics.json").read_text())["compile"] is True
    assert metrics["updates"] == 2 and metrics["fit"]["val/loss"] < 20
