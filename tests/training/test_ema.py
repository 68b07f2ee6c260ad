"""The EMA callback: the average it keeps is the formula's, validation and ema.ckpt use it,
checkpoints keep the raw weights, and test_ckpt=ema tests it."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.inference.checkpoint import model_weights
from aiayn.training.run import run
from tests.helpers import compose_train


def test_ema_follows_the_formula_and_lives_beside_the_raw_weights(tmp_path):
    trace = tmp_path / "trace.pt"
    overrides = [
        "model=tiny",
        "trainer.max_steps=6",
        "trainer.max_epochs=-1",
        "trainer.val_check_interval=6",
        "trainer.check_val_every_n_epoch=null",
        "callbacks=[default,ema]",
        "callbacks.ema.decay=0.5",
        "test_ckpt=ema",
        "~callbacks.rich_progress_bar",
        "+callbacks.trace._target_=tests.training.callbacks.WeightTrace",
        f"+callbacks.trace.path={trace}",
    ]
    metrics = run(compose_train(overrides, output_dir=tmp_path))
    steps = torch.load(trace, weights_only=True)  # fit start, then after each of 6 updates
    assert len(steps) == 7
    expected = {k: v.double() for k, v in steps[0].items()}
    for weights in steps[1:]:
        expected = {k: 0.5 * v + 0.5 * weights[k].double() for k, v in expected.items()}
    ema = torch.load(tmp_path / "checkpoints" / "ema.ckpt", weights_only=True)
    for key, value in model_weights(ema).items():
        torch.testing.assert_close(value.double(), expected[f"model.{key}"], atol=1e-6, rtol=0)
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    for key, value in model_weights(last).items():  # raw weights, the EMA in callback state
        assert torch.equal(value, steps[-1][f"model.{key}"]), key
    (state,) = [v for k, v in last["callbacks"].items() if k.startswith("EMA")]
    assert state["updates"] == 6
    torch.testing.assert_close(
        state["ema"]["model.output.weight"].double(), expected["model.output.weight"]
    )
    assert metrics["test_checkpoint"].endswith("ema.ckpt")
    assert json.loads((tmp_path / "metrics.json").read_text())["test"]["test/bleu"] >= 0


def test_decay_is_checked():
    from aiayn.callbacks import EMA

    with pytest.raises(ValueError, match=r"EMA\.decay"):
        EMA(decay=1.0)
