"""The GPU layer: what only a CUDA machine can run (skipped elsewhere). `python -m pytest
tests/gpu` on a GPU machine runs it unchanged: the `gpu` trainer preset, bf16-mixed and
16-mixed training through `train.py`, and decoding on the GPU."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import SIXTY_STEPS, assert_loss_fell, cli, cli_overrides, csv_metrics, run_dirs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOY = ["data.toy_train_size=2000", "data.toy_val_size=50", "data.toy_test_size=50"]


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_trainer_gpu_trains_and_decodes(precision, tmp_path):
    args = [
        *cli_overrides(tmp_path),
        *TOY,
        *SIXTY_STEPS,
        "trainer=gpu",
        f"trainer.precision={precision}",
    ]
    result = cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    losses = csv_metrics(run)["train/loss"]
    assert_loss_fell(losses, by=1.0)
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 <= metrics["test"]["test/bleu"] <= 100.0
    assert "CUDA" in result.stdout + result.stderr or "GPU available: True" in result.stderr


def test_checkpoint_translates_on_the_gpu_as_on_the_cpu(tmp_path):
    from aiayn.inference import load_checkpoint

    result = cli([*cli_overrides(tmp_path), *TOY, *SIXTY_STEPS, "trainer=gpu"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    lines = ["the red dog sees the big cat.", "yesterday Anna saw two green birds."]
    on_gpu = load_checkpoint(run / "checkpoints" / "last.ckpt", "cuda").translate(lines)
    on_cpu = load_checkpoint(run / "checkpoints" / "last.ckpt", "cpu").translate(lines)
    assert on_gpu == on_cpu


def test_fsdp_on_the_gpus_there_are_trains_in_bf16_and_its_checkpoint_loads(tmp_path):
    """`trainer=fsdp` on every GPU of the machine (one is enough to exercise sharding,
    autocast and the whole-checkpoint gather) in bf16-mixed, as the README's command."""
    devices = torch.cuda.device_count()
    args = [*cli_overrides(tmp_path), *TOY, *SIXTY_STEPS, "trainer=fsdp", "callbacks=default"]
    args += [
        "trainer.accelerator=gpu",
        "trainer.precision=bf16-mixed",
        f"trainer.devices={devices}",
    ]
    result = cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"units sharded over {devices} processes" in result.stdout
    (run,) = run_dirs(tmp_path)
    losses = csv_metrics(run)["train/loss"]
    assert_loss_fell(losses, by=1.0)
    from aiayn.inference import load_checkpoint

    lines = ["the red dog sees the big cat.", "yesterday Anna saw two green birds."]
    last = run / "checkpoints" / "last.ckpt"  # whole weights: one device decodes as another
    assert load_checkpoint(last, "cuda").translate(lines) == load_checkpoint(last, "cpu").translate(
        lines
    )
