"""Cluster sweeps through Hydra's own plugins, run for real: a multirun through submitit's local
executor (the SLURM launcher's twin), an Optuna study on the toy corpus, and the SLURM launcher
preset composed against the trainer it launches."""

from __future__ import annotations

import datetime
import json

import pytest
import yaml

from tests.helpers import CONFIG_ERRORS, cli, cli_overrides, compose_train, compose_with_hydra

TOY = ["data.toy.train_size=600", "data.toy.val_size=30", "data.toy.test_size=30"]
SHORT = [
    "trainer.max_steps=12",
    "trainer.max_epochs=-1",
    "trainer.val_check_interval=6",
    "trainer.check_val_every_n_epoch=null",
    "test=false",
]


def _jobs(tmp_path):
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file())
    return sweep_dir, jobs


@pytest.mark.slow
def test_submitit_local_runs_each_job_in_its_own_directory_and_w_and_b_run(tmp_path):
    """Two jobs through submitit's local executor; the multirun directory its timestamp names
    is already taken (another multirun started that second), so it claims `<timestamp>_1`,
    and both job processes write there."""
    multiruns = tmp_path / "logs" / "train" / "multiruns"
    now = datetime.datetime.now()
    taken = [
        (now + datetime.timedelta(seconds=s)).strftime("%Y-%m-%d_%H-%M-%S") for s in range(300)
    ]
    for name in taken:
        (multiruns / name).mkdir(parents=True)
    result = cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=20",
            *cli_overrides(tmp_path),
            *TOY,
            *SHORT,
            "logger=[csv,wandb]",
            "seed=1,2",
        ],
        tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = [p for p in multiruns.iterdir() if any(p.iterdir())]
    assert sweep_dir.name.endswith("_1") and sweep_dir.name[:-2] in taken
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file())
    assert [j.name for j in jobs] == ["0", "1"]
    seeds = [yaml.safe_load((j / ".hydra" / "overrides.yaml").read_text()) for j in jobs]
    assert [[o for o in s if o.startswith("seed=")] for s in seeds] == [["seed=1"], ["seed=2"]]
    runs = [next((j / "wandb").glob("offline-run-*")) for j in jobs]
    assert len({r.name for r in runs}) == 2
    # submitit ran them: its per-job logs and results sit in the sweep's .submitit folder
    results = list((sweep_dir / ".submitit").glob("*/*_result.pkl"))
    assert len(results) == 2
    losses = [json.loads((j / "metrics.json").read_text())["fit"]["val/loss"] for j in jobs]
    assert losses[0] != losses[1]  # two seeds, two different runs


@pytest.mark.slow
def test_optuna_study_optimises_the_configured_metric(tmp_path):
    """hparams_search=optuna, three trials minimising val/loss: every trial a run directory,
    and Optuna's best value is the best trial's val/loss as that run's metrics.json says."""
    result = cli(
        [
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.n_startup_trials=2",
            "hydra.sweeper.direction=minimize",
            "optimized_metric=val/loss",
            *cli_overrides(tmp_path),
            *TOY,
            *SHORT,
        ],
        tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir, jobs = _jobs(tmp_path)
    assert len(jobs) == 3
    losses = [json.loads((j / "metrics.json").read_text())["fit"]["val/loss"] for j in jobs]
    study = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert study["best_value"] == pytest.approx(min(losses), rel=1e-6)
    assert set(study["best_params"]) == {"optim.lr", "optim.warmup_steps", "model.dropout"}
    swept = [yaml.safe_load((j / ".hydra" / "overrides.yaml").read_text()) for j in jobs]
    lrs = {o for s in swept for o in s if o.startswith("optim.lr=")}
    assert len(lrs) == 3  # each trial drew its own learning rate


def test_slurm_launcher_preset_follows_the_trainer(tmp_path):
    """hydra/launcher=slurm_gpu: one SLURM task per GPU on each node, as Lightning's SLURM
    environment expects, and the cluster keys in place."""
    overrides = ["hydra/launcher=slurm_gpu", "trainer.devices=4", "trainer.num_nodes=2"]
    cfg = compose_with_hydra("train", overrides)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (4, 4, 2)
    assert launcher.timeout_min == 4320 and launcher.partition is None


def test_an_unknown_optimized_metric_is_refused_by_name(tmp_path):
    from aiayn.config import TrainConfig, to_schema

    with pytest.raises(CONFIG_ERRORS, match="optimized_metric='val/acc' is not a metric"):
        to_schema(compose_train(["optimized_metric=val/acc"], tmp_path), TrainConfig)
