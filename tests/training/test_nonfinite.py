"""Non-finite gradients: the update is skipped and counted; too many in a row stop the run
with one line naming the update, the learning rate and the last finite loss; metrics.json
stays strict JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aiayn.training.run import strict_json
from tests.helpers import cli, cli_overrides, compose_train, csv_metrics, run_dirs

EIGHT_STEPS = [
    "trainer.max_steps=8",
    "trainer.max_epochs=-1",
    "trainer.val_check_interval=8",
    "trainer.check_val_every_n_epoch=null",
    "trainer.log_every_n_steps=1",
    "test=false",
]


def test_a_nonfinite_update_is_skipped_counted_and_training_goes_on(tmp_path):
    # Lightning calls the callback's hook before the module's, so the module sees the NaN
    from aiayn.training.run import run

    marker = tmp_path / "checked"
    spy = ["+callbacks.nan._target_=tests.training.callbacks.NaNGradientAt"]
    spy += ["+callbacks.nan.step=3", f"+callbacks.nan.marker={marker}"]
    cfg = compose_train(["model=tiny", *EIGHT_STEPS, "logger=csv", *spy], output_dir=tmp_path)
    run(cfg)  # the callback fails the run if the skipped update changed a weight
    assert marker.read_text() == "done"
    logged = csv_metrics(tmp_path)
    skipped = logged["train/skipped_updates"]  # the count so far, logged every update
    assert skipped == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], skipped
    assert math.isnan(logged["train/grad_norm"][3]) and len(logged["train/grad_norm"]) == 8
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["fit"]["val/loss"] < 10


@pytest.mark.slow
def test_divergence_stops_the_run_with_one_line(tmp_path):
    overrides = [*cli_overrides(tmp_path), *EIGHT_STEPS, "optim.lr=1e30", "optim.warmup_steps=0"]
    overrides += ["optim.schedule=constant", "optim.max_nonfinite_updates=2"]
    proc = cli(overrides, tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "training diverged: 3 updates in a row" in line
    assert "optim.max_nonfinite_updates=2" in line and "learning rate 1e+30" in line
    assert "last finite loss" in line and "Lower optim.lr" in line
    (run,) = run_dirs(tmp_path)
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        state = torch.load(ckpt, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_metrics_json_is_strict():
    value = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}}
    assert strict_json(value) == {"a": None, "b": [1.0, None], "c": {"d": 2}}
    json.dumps(strict_json(value), allow_nan=False)
