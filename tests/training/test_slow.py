"""Slow end-to-end runs: resume after SIGKILL, DDP on two CPU processes, multirun + sweep
summary, W&B offline runs. Run with `python -m pytest -m slow`."""

import json
import signal

import pytest
import torch

from .helpers import cli, cli_overrides, run_dirs

pytestmark = pytest.mark.slow

TOY = ["data.toy_train_size=1500", "data.toy_val_size=60", "data.toy_test_size=60"]


def _weights(checkpoint) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_resume_after_sigkill_equals_an_uninterrupted_run(tmp_path):
    """Killed right after step N, resumed from last.ckpt to 2N: the same weights as a run
    that never stopped (dropout on, mid-epoch, so RNG and data position both matter)."""
    n = 13  # the toy epoch is longer than 13 batches: the kill lands mid-epoch
    common = [
        *TOY,
        "trainer.max_steps=26",
        "trainer.max_epochs=-1",
        f"trainer.val_check_interval={n}",
        "trainer.check_val_every_n_epoch=null",
        "data.max_tokens=512",
        "model.dropout=0.2",
        "test=false",
    ]
    straight = tmp_path / "straight"
    result = cli([*cli_overrides(straight), *common], straight)
    assert result.returncode == 0, result.stderr[-3000:]

    killed = tmp_path / "killed"
    args = [*cli_overrides(killed), *common]
    result = cli(
        [
            *args,
            "+callbacks.kill._target_=tests.training.callbacks.KillAtStep",
            f"+callbacks.kill.step={n}",
        ],
        killed,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    (first,) = run_dirs(killed)
    last = first / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == n

    result = cli([*args, f"ckpt_path={last}"], killed)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = next(d for d in run_dirs(killed) if d != first)
    straight_ckpt = run_dirs(straight)[0] / "checkpoints" / "last.ckpt"
    assert torch.load(straight_ckpt, weights_only=False)["global_step"] == 2 * n
    b = resumed / "checkpoints" / "last.ckpt"
    assert torch.load(b, weights_only=False)["global_step"] == 2 * n
    assert _max_diff(_weights(straight_ckpt), _weights(b)) <= 1e-6
    assert json.loads((resumed / "metrics.json").read_text())["resumed_from"] == str(last)


def test_ddp_two_cpu_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """gloo DDP on 2 processes vs 1 process accumulating 2 batches: rank r takes batches
    r, r+2, ... so both see the same global batch per update; weights and val/loss agree."""
    # 1600 pairs make an even number of batches, so the sampler splits none for 2 ranks and
    # both runs cut the very same batch list (checked below)
    data = ["data.toy_train_size=1600", "data.toy_val_size=60", "data.toy_test_size=60"]
    common = [
        *data,
        "trainer.max_steps=12",
        "trainer.max_epochs=-1",
        "trainer.check_val_every_n_epoch=null",
        "optim.warmup_steps=50",
        "model.dropout=0.0",
        "data.max_tokens=512",
        "trainer.accelerator=cpu",
        "test=false",
        "val_bleu=false",
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.mode=min",
    ]
    one = tmp_path / "one"
    # val_check_interval counts batches: 12 batches of one process = 6 updates of two
    one_args = ["trainer.accumulate_grad_batches=2", "trainer.val_check_interval=12"]
    result = cli([*cli_overrides(one), *common, *one_args], one)
    assert result.returncode == 0, result.stderr[-3000:]
    two = tmp_path / "two"
    two_args = ["trainer.devices=2", "trainer.strategy=ddp", "trainer.val_check_interval=6"]
    result = cli([*cli_overrides(two), *common, *two_args], two)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distributed_backend=gloo" in result.stdout + result.stderr
    assert "Starting with 2 processes" in result.stdout + result.stderr
    (run_one,) = run_dirs(one)
    (run_two,) = run_dirs(two)
    _assert_same_batches_for_one_and_two_ranks(one / "cache")
    wa = _weights(run_one / "checkpoints" / "last.ckpt")
    wb = _weights(run_two / "checkpoints" / "last.ckpt")
    # equal up to float summation order, which Adam's early sign-like steps amplify on
    # near-zero gradients: compare the weights as a whole, not element by element
    diff = torch.cat([(wa[k] - wb[k]).flatten() for k in wa]).norm()
    assert diff / torch.cat([wa[k].flatten() for k in wa]).norm() < 1e-2

    def val_losses(run):
        rows = (run / "csv" / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        col = header.index("val/loss")
        return [float(r.split(",")[col]) for r in rows[1:] if r.split(",")[col]]

    la, lb = val_losses(run_one), val_losses(run_two)
    assert len(la) == len(lb) == 2
    assert la == pytest.approx(lb, rel=2e-3)
    assert la[1] < la[0] - 0.2  # and the runs did learn: the comparison is not vacuous


def _assert_same_batches_for_one_and_two_ranks(cache):
    from aiayn.data.dataset import SplitDataset
    from aiayn.data.sampler import TokenBatchSampler

    (split_dir,) = cache.glob("toy-en-de-*")
    data = SplitDataset(split_dir, "train")
    lengths = (data.src_lengths, data.tgt_lengths)
    single = TokenBatchSampler(*lengths, 512, True, seed=1234, rank=0, world_size=1)
    ranks = [TokenBatchSampler(*lengths, 512, True, 1234, r, 2) for r in (0, 1)]
    interleaved = [b for pair in zip(*ranks, strict=True) for b in pair]
    assert list(single) == interleaved


def test_multirun_six_jobs_and_the_sweep_summary(tmp_path):
    """`train.py -m model.num_heads=1,4,8 model.norm_first=false,true`: six jobs, each in its
    own directory with its own W&B offline run; `aiayn.sweeps` tabulates and plots them."""
    result = cli(
        [
            "-m",
            *cli_overrides(tmp_path),
            *TOY,
            "model.num_heads=1,4,8",
            "model.norm_first=false,true",
            "trainer.max_steps=20",
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=20",
            "trainer.check_val_every_n_epoch=null",
            "logger=many",
        ],
        tmp_path,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file())
    assert len(jobs) == 6
    wandb_runs = {r.name for j in jobs for r in (j / "wandb").glob("offline-run-*")}
    assert len(wandb_runs) == 6
    for job in jobs:
        (run,) = (job / "wandb").glob("offline-run-*")
        assert list(run.glob("*.wandb"))

    result = cli([str(sweep_dir)], tmp_path, module="aiayn.sweeps")
    assert result.returncode == 0, result.stderr[-3000:]
    table = (sweep_dir / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + 6
    rows = [line.split(" | ")[1].lower() for line in table[2:]]  # only what varies is shown
    assert rows == [
        f"model.num_heads={h} model.norm_first={n}" for h in (1, 4, 8) for n in ("false", "true")
    ]
    csv_rows = (sweep_dir / "sweep.csv").read_text().splitlines()
    assert len(csv_rows) == 7 and all(r.split(",")[3] for r in csv_rows[1:])
    assert (sweep_dir / "sweep.png").stat().st_size > 1000
